"""Before a trial runs: prune what cannot fit (``predicted_oom``, from :mod:`sweeper.estimate`) and what is at least as
large as a configuration that already ran out of memory (``dominated_oom``); a configuration no larger than one that
fit is never pruned by prediction.

The rules work on trial configs as dicts (``TrialConfig.to_dict()``); no torch. :func:`memory_predictor` and
:func:`known_memory` gather what they need from the model's shape and the study.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from sweeper.estimate import ModelShape, estimate_memory, known_shape, settings_from
from sweeper.study._stored import stored_trials
from sweeper.trial import cuda_visible

#: Keys whose larger value needs more memory (all else equal), and how to compare them.
_GROWS = ("per_device_train_batch_size", "max_seq_length", "r")
#: Keys that change memory in ways the dominance rule does not order: they must be equal.
_SAME = ("gradient_accumulation_steps", "optim", "lora_dropout", "model", "dataset", "memory_limit_gib")
_WIDTH = {"bfloat16": 2, "float16": 2, "float32": 4}


def at_least_as_large(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether configuration ``a`` needs at least the memory of ``b`` by the dominance rule: ``a`` is at least as
    large in batch, ``max_seq_length`` and ``r``, adapts a superset of ``b``'s target modules, computes in a dtype at
    least as wide, has gradient checkpointing off where ``b`` has it off, and double quant off where ``b`` has it
    off; every other memory-relevant key (:data:`_SAME`) is equal. Keys that do not change memory (lora_alpha_ratio,
    learning_rate, quant type, seed, ...) may differ."""
    if any(a.get(k) != b.get(k) for k in _SAME):
        return False
    if any(a[k] < b[k] for k in _GROWS):
        return False
    if not set(b["target_modules"]) <= set(a["target_modules"]):
        return False
    if _WIDTH[a["bnb_4bit_compute_dtype"]] < _WIDTH[b["bnb_4bit_compute_dtype"]]:
        return False
    if a["gradient_checkpointing"] and not b["gradient_checkpointing"]:
        return False
    return not (a["bnb_4bit_use_double_quant"] and not b["bnb_4bit_use_double_quant"])


@dataclass(frozen=True, kw_only=True)
class Known:
    """A finished trial's configuration and whether its memory fit: ``fits`` (complete or NaN) or ``oom``."""

    number: int
    config: Mapping[str, Any]
    fits: bool


def dominating_oom(config: Mapping[str, Any], known: Iterable[Known]) -> Known | None:
    """The first known OOM that ``config`` is at least as large as, or None."""
    return next((k for k in known if not k.fits and at_least_as_large(config, k.config)), None)


def known_to_fit(config: Mapping[str, Any], known: Iterable[Known]) -> Known | None:
    """A known fit that is at least as large as ``config`` (so ``config`` fits too), or None."""
    return next((k for k in known if k.fits and at_least_as_large(k.config, config)), None)


def preflight(
    config: Mapping[str, Any], predicted_peak_gib: float | None, known: Iterable[Known]
) -> tuple[str, str] | None:
    """Whether to prune a configuration before running it.

    Returns:
        ``("dominated_oom", reason)`` when it is at least as large as a known OOM; ``("predicted_oom", reason)`` when
        its predicted peak exceeds ``memory_limit_gib * (1 + preflight_margin)`` and no known fit is at least as
        large; None to run it.
    """
    known = list(known)
    oom = dominating_oom(config, known)
    if oom is not None:
        return (
            "dominated_oom",
            f"at least as large as trial {oom.number}, which ran out of memory "
            f"(batch {oom.config['per_device_train_batch_size']} x "
            f"{oom.config['max_seq_length']} tokens, r={oom.config['r']}): not run",
        )
    limit = config["memory_limit_gib"] * (1 + config.get("preflight_margin", 0.10))
    if predicted_peak_gib is not None and predicted_peak_gib > limit and known_to_fit(config, known) is None:
        return (
            "predicted_oom",
            f"predicted peak {predicted_peak_gib:.2f} GiB exceeds memory_limit_gib="
            f"{config['memory_limit_gib']:g} by more than preflight_margin="
            f"{config.get('preflight_margin', 0.10):g}: not run (sweep estimate)",
        )
    return None


def memory_predictor(
    model_path: str, name: str, attn_implementation: str
) -> Callable[[Mapping[str, Any]], float | None]:
    """A function from a trial config (dict) to its predicted peak in GiB (:func:`sweeper.estimate.estimate_memory`)
    on the device the trials will use (CUDA when a GPU is visible, else the CPU); it returns None when the model's
    shape is unknown (no readable ``config.json``)."""
    known = known_shape(name)
    try:
        shape = ModelShape.from_config(known) if known else ModelShape.from_dir(model_path)
    except (OSError, ValueError, KeyError):
        return lambda config: None
    device = "cuda" if cuda_visible() else "cpu"

    def predict(config: Mapping[str, Any]) -> float | None:
        return estimate_memory(shape, settings_from(config, attn_implementation, device)).predicted_peak_gib

    return predict


def known_memory(study: optuna.Study) -> list[Known]:
    """What the study knows about memory: each measured trial's config, and whether it fit (complete or NaN) or ran
    out of memory (:attr:`sweeper.study.TrialStatus.fits`); repeats and trials without a stored config left out."""
    out = []
    for t in stored_trials(study):
        fits = t.status.fits
        if t.is_repeat or fits is None or "config" not in t.user_attrs or not t.state.is_finished():
            continue
        out.append(Known(number=t.number, config=t.user_attrs["config"], fits=fits))
    return out
