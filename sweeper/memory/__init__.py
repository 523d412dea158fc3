"""How a trial's peak memory is predicted and corrected, before it runs: pure, no torch, no Optuna, no study.

- the memory model (:func:`estimate_memory` of a :class:`ModelShape` and :class:`MemorySettings`, every term in its
  own function with its formula and source), :func:`memory_predictor` from a model and a device, and the model over
  a space's memory-relevant grid (:func:`estimate_space`, :func:`frontier`, ``sweep estimate``);
- the line that refuses a space of which nothing is predicted to fit (:func:`nothing_fits`);
- the dominance rule (:func:`at_least_as_large` on each device's :data:`DIRECTIONS`, its keys read from the schema's
  memory roles, :attr:`sweeper.space.KeySpec.memory`) and the preflight's decision
  (:func:`preflight`: ``dominated_oom``, ``predicted_oom`` or run it);
- the correction fitted on measured peaks (:class:`Calibration`, :func:`fit_calibration`: a median ratio or a
  Theil-Sen line per group of configurations).

What a study stores and measures (its known fits and OOMs, its measured points, the stored correction) is read and
written by :mod:`sweeper.study`; a checkpoint's ``config.json`` by :mod:`sweeper.checkpoint`.
"""

from sweeper.memory._calibration import (
    MIN_SPAN_GIB,
    RATIO_BOUNDS,
    SLOPE_BOUNDS,
    Calibration,
    CalibrationPoint,
    fit_calibration,
    group_of,
    median_abs,
    theil_sen,
)
from sweeper.memory._dominance import (
    DIRECTIONS,
    Known,
    at_least_as_large,
    direction_of,
    dominating_oom,
    known_to_fit,
    preflight,
)
from sweeper.memory._grid import MAX_POINTS, SpaceEstimate, estimate_space, frontier, grid_values, nothing_fits
from sweeper.memory._model import (
    ALLOCATOR_OVERHEAD,
    BLOCKSIZE_4BIT,
    BLOCKSIZE_8BIT_OPTIM,
    BLOCKSIZE_NESTED,
    CPU_PROCESS_BASELINE_GIB,
    CUDA_CONTEXT_GIB,
    GIB,
    KNOWN_SHAPES,
    MEMORY_KEYS,
    MIN_8BIT_SIZE,
    MemoryEstimate,
    MemorySettings,
    ModelShape,
    activation_bytes,
    dequantization_bytes,
    estimate_memory,
    gradient_bytes,
    known_shape,
    layer_activation_bytes,
    logits_saved_bytes,
    logits_transient_bytes,
    lora_parameter_count,
    lora_weight_bytes,
    memory_predictor,
    optimizer_state_bytes,
    quantized_weight_bytes,
    recompute_bytes,
    settings_from,
    unquantized_weight_bytes,
)

__all__ = [
    "ALLOCATOR_OVERHEAD",
    "BLOCKSIZE_4BIT",
    "BLOCKSIZE_8BIT_OPTIM",
    "BLOCKSIZE_NESTED",
    "CPU_PROCESS_BASELINE_GIB",
    "CUDA_CONTEXT_GIB",
    "DIRECTIONS",
    "GIB",
    "KNOWN_SHAPES",
    "MAX_POINTS",
    "MEMORY_KEYS",
    "MIN_8BIT_SIZE",
    "MIN_SPAN_GIB",
    "RATIO_BOUNDS",
    "SLOPE_BOUNDS",
    "Calibration",
    "CalibrationPoint",
    "Known",
    "MemoryEstimate",
    "MemorySettings",
    "ModelShape",
    "SpaceEstimate",
    "activation_bytes",
    "at_least_as_large",
    "dequantization_bytes",
    "direction_of",
    "dominating_oom",
    "estimate_memory",
    "estimate_space",
    "fit_calibration",
    "frontier",
    "gradient_bytes",
    "grid_values",
    "group_of",
    "known_shape",
    "known_to_fit",
    "layer_activation_bytes",
    "logits_saved_bytes",
    "logits_transient_bytes",
    "lora_parameter_count",
    "lora_weight_bytes",
    "median_abs",
    "memory_predictor",
    "nothing_fits",
    "optimizer_state_bytes",
    "preflight",
    "quantized_weight_bytes",
    "recompute_bytes",
    "settings_from",
    "theil_sen",
    "unquantized_weight_bytes",
]
