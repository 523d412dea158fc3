"""Before a trial runs: prune what cannot fit (``predicted_oom``, from :mod:`sweeper.estimate`) and what is at least as
large as a configuration that already ran out of memory (``dominated_oom``); a configuration no larger than one that
fit is never pruned by prediction.

Pure: works on trial configs as dicts (``TrialConfig.to_dict()``), no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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


def preflight(config: Mapping[str, Any], predicted_peak_gib: float | None, known: Iterable[Known]
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
        return ("dominated_oom", f"at least as large as trial {oom.number}, which ran out of memory "
                                 f"(batch {oom.config['per_device_train_batch_size']} x "
                                 f"{oom.config['max_seq_length']} tokens, r={oom.config['r']}): not run")
    limit = config["memory_limit_gib"] * (1 + config.get("preflight_margin", 0.10))
    if predicted_peak_gib is not None and predicted_peak_gib > limit and known_to_fit(config, known) is None:
        return ("predicted_oom", f"predicted peak {predicted_peak_gib:.2f} GiB exceeds memory_limit_gib="
                                 f"{config['memory_limit_gib']:g} by more than preflight_margin="
                                 f"{config.get('preflight_margin', 0.10):g}: not run (sweep estimate)")
    return None
