"""How a trial's peak memory is predicted and corrected, before it runs: pure, no torch, no Optuna, no study.

- the memory model (:func:`estimate_memory` of a :class:`ModelShape` and :class:`MemorySettings`, every term in its
  own function with its formula and source), :func:`memory_predictor` from a model and a device, and the model over
  a space's memory-relevant grid (:func:`estimate_space`, :func:`frontier`, ``sweep estimate``);
- the line that refuses a space of which nothing is predicted to fit (:func:`nothing_fits`);
- the dominance rule (:func:`at_least_as_large` on each device's :data:`DIRECTIONS`, its keys read from the schema's
  memory roles, :attr:`sweeper.space._schema.KeySpec.memory`) and the preflight's decision
  (:func:`preflight`: ``dominated_oom``, ``predicted_oom`` or run it);
- the correction fitted on measured peaks (:class:`Calibration`, :func:`fit_calibration`: a median ratio or a
  Theil-Sen line per group of configurations).

What a study stores and measures (its known fits and OOMs, its measured points, the stored correction) is read and
written by :mod:`sweeper.study`; a checkpoint's ``config.json`` by :mod:`sweeper.checkpoint`.
"""

from sweeper.memory._calibration import (
    BASELINE_NUMBER,
    Calibration,
    CalibrationPoint,
    fit_calibration,
    group_of,
    median_abs,
)
from sweeper.memory._dominance import Known, at_least_as_large, preflight
from sweeper.memory._grid import estimate_space, frontier, nothing_fits, smallest_predicted
from sweeper.memory._model import GIB, memory_predictor
from sweeper.memory._shapes import ModelShape, known_shape

__all__ = [
    "BASELINE_NUMBER",
    "GIB",
    "Calibration",
    "CalibrationPoint",
    "Known",
    "ModelShape",
    "at_least_as_large",
    "estimate_space",
    "fit_calibration",
    "frontier",
    "group_of",
    "known_shape",
    "median_abs",
    "memory_predictor",
    "nothing_fits",
    "preflight",
    "smallest_predicted",
]
