"""Before a trial runs: the dominance rule (a configuration at least as large as one that ran out of memory runs out
too, one no larger than one that fit fits too) and the preflight's decision, ``dominated_oom`` or ``predicted_oom``
(the memory model's prediction corrected by what the study measured, :class:`Calibration`).

The rules work on :class:`sweeper.space.TrialConfig`; no torch, no study: :func:`sweeper.sweep._preflight.known_memory`
gathers what a study knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sweeper.space import TrialConfig, memory_roles

if TYPE_CHECKING:
    from sweeper.memory._calibration import Calibration

_ROLES = memory_roles(TrialConfig)
#: Keys whose larger value never needs less memory, all else equal (memory role ``grows``,
#: :attr:`sweeper.space._schema.KeySpec.memory`): batch, ``max_seq_length``, ``r``, and the target modules by inclusion.
_GROWS = tuple(key for key, role in _ROLES.items() if role == "grows")
#: Switches that save memory when on (memory role ``shrinks``): off is the larger setting.
_SHRINKS = tuple(key for key, role in _ROLES.items() if role == "shrinks")
#: Keys that change memory in ways the dominance rule does not order (memory role ``same``: the compute dtype, the
#: optimizer, the cap, the model and data, ...): they must be equal. A key that declares no role counts here too,
#: so that it never makes a configuration look larger than it is (the tests fail on it).
_SAME = tuple(key for key, role in _ROLES.items() if role in ("same", None))
#: The name of a key's direction in :data:`DIRECTIONS` where it is not the key's own: the larger setting of a
#: ``shrinks`` switch is off.
_DIRECTION_OF = {"gradient_checkpointing": "no_checkpointing", "bnb_4bit_use_double_quant": "no_dq"}

#: The directions the dominance rule may use on each device (``cpu``: the resident set; ``cuda``: reserved memory),
#: each measured on the CPU by ``tests/sweep/test_preflight.py`` with real trials: a larger batch, ``max_seq_length`` or
#: ``r``, a superset of target modules, gradient checkpointing off against on, double quant off against on. The CUDA
#: set is the same by the memory model's terms (:mod:`sweeper.memory._model`); no GPU measurement yet. Each is a key of
#: memory role ``grows`` or ``shrinks`` (:func:`direction_of`), and every such key is one (tests/memory/
#: test_memory_roles.py); a key not listed for a device must be equal there.
DIRECTIONS: dict[str, tuple[str, ...]] = {
    "cpu": ("per_device_train_batch_size", "max_seq_length", "r", "target_modules", "no_checkpointing", "no_dq"),
    "cuda": ("per_device_train_batch_size", "max_seq_length", "r", "target_modules", "no_checkpointing", "no_dq"),
}


def direction_of(key: str) -> str:
    """The name of a ``grows`` or ``shrinks`` key's direction in :data:`DIRECTIONS` (``gradient_checkpointing`` ->
    ``no_checkpointing``, ``bnb_4bit_use_double_quant`` -> ``no_dq``, any other key its own name)."""
    return _DIRECTION_OF.get(key, key)


def _no_smaller(x: object, y: object) -> bool:
    """``x >= y``: numbers and switches by value (off < on), a list of names by inclusion."""
    if isinstance(x, tuple | list) and isinstance(y, tuple | list):
        return set(x) >= set(y)
    return x >= y  # type: ignore[operator]


def at_least_as_large(a: TrialConfig, b: TrialConfig, device: str = "cpu") -> bool:
    """Whether configuration ``a`` needs at least the memory of ``b`` on ``device`` by the dominance rule: along each
    key of memory role ``grows`` or ``shrinks`` (:attr:`sweeper.space._schema.KeySpec.memory`) whose direction
    (:func:`direction_of`) :data:`DIRECTIONS` lists for that device ``a`` is at least as large (batch,
    ``max_seq_length`` and ``r``; a superset of ``b``'s target modules; gradient checkpointing off where ``b`` has it
    off; double quant off where ``b`` has it off), every such key without a direction there is equal, and every key
    of role ``same`` (:data:`_SAME`, the compute dtype among them) is equal. Keys of role ``none`` (lora_alpha_ratio,
    learning_rate, quant type, seed, ...) may differ."""
    if any(getattr(a, k) != getattr(b, k) for k in _SAME):
        return False
    directions = DIRECTIONS.get(device, DIRECTIONS["cpu"])
    for key in _GROWS + _SHRINKS:
        ak, bk = getattr(a, key), getattr(b, key)
        if direction_of(key) not in directions:
            if not (_no_smaller(ak, bk) and _no_smaller(bk, ak)):  # equal (a list of names as a set)
                return False
        elif not (_no_smaller(ak, bk) if key in _GROWS else _no_smaller(bk, ak)):
            return False
    return True


@dataclass(frozen=True, kw_only=True)
class Known:
    """A finished trial's configuration and whether its memory fit: ``fits`` (complete or NaN) or ``oom``;
    ``memory_kind`` is how it was measured (``cpu_peak_rss``, ``cuda_max_reserved``; None when unknown)."""

    number: int
    config: TrialConfig
    fits: bool
    memory_kind: str | None = None


def dominating_oom(config: TrialConfig, known: Iterable[Known], device: str = "cpu") -> Known | None:
    """The first known OOM that ``config`` is at least as large as on ``device``, or None."""
    return next((k for k in known if not k.fits and at_least_as_large(config, k.config, device)), None)


def known_to_fit(config: TrialConfig, known: Iterable[Known], device: str = "cpu") -> Known | None:
    """A known fit that is at least as large as ``config`` on ``device`` (so ``config`` fits too), or None."""
    return next((k for k in known if k.fits and at_least_as_large(k.config, config, device)), None)


def preflight(
    config: TrialConfig,
    predicted_peak_gib: float | None,
    known: Iterable[Known],
    *,
    device: str = "cpu",
    calibration: Calibration | None = None,
) -> tuple[Literal["dominated_oom", "predicted_oom"], str] | None:
    """Whether to prune a configuration before running it.

    Args:
        config: The trial's settings.
        predicted_peak_gib: The memory model's prediction (GiB), None when unknown.
        known: What the study measured (:func:`sweeper.sweep._preflight.known_memory`), of the same memory kind as this
            machine's trials.
        device: ``cpu`` or ``cuda``: which dominance directions hold (:data:`DIRECTIONS`).
        calibration: The study's correction of the memory model (:class:`Calibration`), applied to the prediction
            before it is compared with the cap.

    Returns:
        ``("dominated_oom", reason)`` when it is at least as large as a known OOM; ``("predicted_oom", reason)`` when
        its (corrected) predicted peak exceeds ``memory_limit_gib * (1 + preflight_margin)`` and no known fit is at
        least as large; None to run it. The status is the value of :class:`sweeper.trial.TrialStatus` of that name
        (a layer above this one), which :class:`sweeper.trial.TrialResult` takes as it is.
    """
    known = list(known)
    oom = dominating_oom(config, known, device)
    if oom is not None:
        return (
            "dominated_oom",
            f"at least as large as trial {oom.number}, which ran out of memory "
            f"(batch {oom.config.per_device_train_batch_size} x "
            f"{oom.config.max_seq_length} tokens, r={oom.config.r}): not run",
        )
    if predicted_peak_gib is None:
        return None
    peak, how = predicted_peak_gib, ""
    if calibration is not None:
        peak, source = calibration.explain(config, predicted_peak_gib)
        how = f" ({source})"
    limit = config.memory_limit_gib * (1 + config.preflight_margin)
    if peak > limit and known_to_fit(config, known, device) is None:
        return (
            "predicted_oom",
            f"predicted peak {peak:.2f} GiB{how} exceeds memory_limit_gib="
            f"{config.memory_limit_gib:g} by more than preflight_margin="
            f"{config.preflight_margin:g}: not run (sweep estimate)",
        )
    return None
