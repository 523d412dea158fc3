"""The door of the benchmarks (``benchmarks/``) and of experiments into sweeper's internals: the names they reach
that no package face exports, each re-exported here from its module. No stability promise beyond this list: a name
may change with its module, and the benchmark that uses it changes with it, in the same commit (the benchmarks are
checked for private imports by ``tests/test_architecture.py``; the ``private_modules`` contract of
``[tool.importlinter]`` in pyproject.toml names the modules this door may reach). What a package face exports
(``sweeper.memory``, ``sweeper.study``, ``sweeper.stability``, ``sweeper.trial``, ...) is imported from the face.

The names are loaded on first use (PEP 562), so importing this module imports nothing behind it (no torch): the
trial process's own names (its CPU peak counting, its CUDA allocator setting, its progress lines) load only
``sweeper.trial._child.memory`` or ``sweeper.trial._child.progress`` when used.

The names, by what they are for:

- the memory model's terms and settings (``benchmarks/gpu``, ``benchmarks/memory``): :func:`estimate_memory`,
  :class:`MemorySettings`, :func:`settings_from`, :data:`KNOWN_SHAPES`, the two fitted CUDA factors and each term's
  bytes (``*_bytes``);
- the trial process's measurements: :func:`peak_memory_gib`, :func:`process_memory_gib`, :func:`reset_cpu_peak` (the
  CPU peak counting), :func:`set_cuda_allocator`, :class:`ProgressSender`, and :class:`StressOutcome`;
- the stability figures' constants and parts (``benchmarks/stability``): :data:`LONG_RUN_FACTOR`,
  :data:`STRESS_CAP`, :func:`probe_rebound`, :func:`divergence_chance`, :data:`DIVERGENCE_MODEL` (its
  ``safe_margin`` per horizon);
- the study's objectives, calibration and front (``benchmarks/samplers``, ``benchmarks/memory``):
  :data:`DEFAULT_OBJECTIVES`, :func:`resolve_objectives`, :func:`calibration_points`, :func:`prediction_errors`,
  :func:`hypervolume`, :func:`reference_point`;
- the export's parts (``benchmarks/memory/export_peak.py``): :func:`export_data`, :func:`settings_of`,
  :func:`render`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper._lazy import lazy_names

if TYPE_CHECKING:
    from sweeper.export._dataset import export_data
    from sweeper.export._settings import settings_of
    from sweeper.export._write import render
    from sweeper.memory._model import (
        CUDA_ACTIVATION_FACTOR,
        CUDA_LOGITS_FACTOR,
        MemorySettings,
        activation_bytes,
        dequantization_bytes,
        estimate_memory,
        gradient_bytes,
        head_copy_bytes,
        logits_saved_bytes,
        logits_transient_bytes,
        lora_weight_bytes,
        optimizer_state_bytes,
        quantized_weight_bytes,
        recompute_bytes,
        settings_from,
        unquantized_weight_bytes,
    )
    from sweeper.memory._shapes import KNOWN_SHAPES
    from sweeper.stability._chance import DIVERGENCE_MODEL, divergence_chance
    from sweeper.stability._instability import probe_rebound
    from sweeper.stability._margin import LONG_RUN_FACTOR, STRESS_CAP
    from sweeper.study._calibration import calibration_points, prediction_errors
    from sweeper.study._objectives import DEFAULT_OBJECTIVES, resolve_objectives
    from sweeper.study._pareto import hypervolume, reference_point
    from sweeper.trial import StressOutcome
    from sweeper.trial._child.memory import peak_memory_gib, process_memory_gib, reset_cpu_peak, set_cuda_allocator
    from sweeper.trial._child.progress import ProgressSender

#: Public name -> the module that defines it.
_HOMES = {
    "CUDA_ACTIVATION_FACTOR": "sweeper.memory._model",
    "CUDA_LOGITS_FACTOR": "sweeper.memory._model",
    "MemorySettings": "sweeper.memory._model",
    "activation_bytes": "sweeper.memory._model",
    "dequantization_bytes": "sweeper.memory._model",
    "estimate_memory": "sweeper.memory._model",
    "gradient_bytes": "sweeper.memory._model",
    "head_copy_bytes": "sweeper.memory._model",
    "logits_saved_bytes": "sweeper.memory._model",
    "logits_transient_bytes": "sweeper.memory._model",
    "lora_weight_bytes": "sweeper.memory._model",
    "optimizer_state_bytes": "sweeper.memory._model",
    "quantized_weight_bytes": "sweeper.memory._model",
    "recompute_bytes": "sweeper.memory._model",
    "settings_from": "sweeper.memory._model",
    "unquantized_weight_bytes": "sweeper.memory._model",
    "KNOWN_SHAPES": "sweeper.memory._shapes",
    "LONG_RUN_FACTOR": "sweeper.stability._margin",
    "STRESS_CAP": "sweeper.stability._margin",
    "probe_rebound": "sweeper.stability._instability",
    "divergence_chance": "sweeper.stability._chance",
    "DIVERGENCE_MODEL": "sweeper.stability._chance",
    "DEFAULT_OBJECTIVES": "sweeper.study._objectives",
    "resolve_objectives": "sweeper.study._objectives",
    "calibration_points": "sweeper.study._calibration",
    "prediction_errors": "sweeper.study._calibration",
    "hypervolume": "sweeper.study._pareto",
    "reference_point": "sweeper.study._pareto",
    "export_data": "sweeper.export._dataset",
    "settings_of": "sweeper.export._settings",
    "render": "sweeper.export._write",
    "StressOutcome": "sweeper.trial",
    "peak_memory_gib": "sweeper.trial._child.memory",
    "process_memory_gib": "sweeper.trial._child.memory",
    "reset_cpu_peak": "sweeper.trial._child.memory",
    "set_cuda_allocator": "sweeper.trial._child.memory",
    "ProgressSender": "sweeper.trial._child.progress",
}

__all__ = [
    "CUDA_ACTIVATION_FACTOR",
    "CUDA_LOGITS_FACTOR",
    "DEFAULT_OBJECTIVES",
    "DIVERGENCE_MODEL",
    "KNOWN_SHAPES",
    "LONG_RUN_FACTOR",
    "STRESS_CAP",
    "MemorySettings",
    "ProgressSender",
    "StressOutcome",
    "activation_bytes",
    "calibration_points",
    "dequantization_bytes",
    "divergence_chance",
    "estimate_memory",
    "export_data",
    "gradient_bytes",
    "head_copy_bytes",
    "hypervolume",
    "logits_saved_bytes",
    "logits_transient_bytes",
    "lora_weight_bytes",
    "optimizer_state_bytes",
    "peak_memory_gib",
    "prediction_errors",
    "probe_rebound",
    "process_memory_gib",
    "quantized_weight_bytes",
    "recompute_bytes",
    "reference_point",
    "render",
    "reset_cpu_peak",
    "resolve_objectives",
    "set_cuda_allocator",
    "settings_from",
    "settings_of",
    "unquantized_weight_bytes",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
