"""The memory model over a space: its memory-relevant grid (``sweep estimate``), the fit frontier, and the line
that refuses a space of which nothing is predicted to fit.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.memory._model import MEMORY_KEYS, estimate_memory, settings_from
from sweeper.memory._shapes import ModelShape
from sweeper.space import Categorical, SearchSpace, TrialConfig, yaml_value

#: At most this many grid points are estimated (about 1 ms each): a larger space is cut, and the command says so.
MAX_POINTS = 20000


def frontier(points: Sequence[Mapping[str, Any]], memory_limit_gib: float) -> list[dict[str, Any]]:
    """The largest ``max_seq_length`` predicted to fit ``memory_limit_gib`` per batch size, at the cheapest setting of
    the other memory keys.

    Args:
        points: ``{"params": {...}, "predicted_peak_gib": x}`` with ``per_device_train_batch_size`` and
            ``max_seq_length`` in ``params``.

    Returns:
        ``[{"per_device_train_batch_size": b, "max_seq_length": s or None, "predicted_peak_gib": x or None,
        "params": {...} or None}]`` by batch size; ``params`` are the cheapest setting at that length (the one the
        frontier holds for), and ``max_seq_length_all_settings`` the largest length that fits whatever the other keys.
    """
    best: dict[tuple[int, int], Mapping[str, Any]] = {}
    worst: dict[tuple[int, int], float] = {}
    for p in points:
        key = (p["params"]["per_device_train_batch_size"], p["params"]["max_seq_length"])
        if key not in best or p["predicted_peak_gib"] < best[key]["predicted_peak_gib"]:
            best[key] = p
        worst[key] = max(worst.get(key, 0.0), p["predicted_peak_gib"])
    out = []
    for b in sorted({k[0] for k in best}):
        fits = sorted((s, p) for (bb, s), p in best.items() if bb == b and p["predicted_peak_gib"] <= memory_limit_gib)
        all_fit = [s for (bb, s), w in worst.items() if bb == b and w <= memory_limit_gib]
        s, p = fits[-1] if fits else (None, None)  # type: ignore[assignment]
        out.append(
            {
                "per_device_train_batch_size": b,
                "max_seq_length": s,
                "predicted_peak_gib": p["predicted_peak_gib"] if p else None,
                "params": dict(p["params"]) if p else None,
                "max_seq_length_all_settings": max(all_fit) if all_fit else None,
            }
        )
    return out


def grid_values(space: SearchSpace, key: str) -> list[Any]:
    """A memory key's values in the estimate grid: a list's choices, a range's ends and middle, or the fixed value."""
    dim = space.search.get(key)
    if dim is None:
        return [space.fixed_value(key)]
    if isinstance(dim, Categorical):
        return list(dict.fromkeys(dim.choices))
    if dim.is_int:
        step = int(dim.step or 1)
        every = list(range(int(dim.low), int(dim.high) + 1, step))
        if len(every) <= 32:  # a stepped range of lengths or batch sizes: every value
            return every
        picks = [every[round(i * (len(every) - 1) / 8)] for i in range(9)]
        return sorted(set(picks))
    mid = (dim.low * dim.high) ** 0.5 if dim.log else (dim.low + dim.high) / 2
    return [dim.low, mid, dim.high]


@dataclass(frozen=True, kw_only=True)
class SpaceEstimate:
    """The memory model over a space's memory-relevant grid (``sweep estimate``).

    Attributes:
        points: ``{"params", "predicted_peak_gib", "terms_gib"}`` per grid point, lowest prediction first; ``params``
            hold ``per_device_train_batch_size``, ``max_seq_length`` and every searched memory key.
        grid_size: Points of the full grid; more than ``len(points)`` when it was cut at :data:`MAX_POINTS`.
        searched: The searched memory keys (:data:`MEMORY_KEYS` order).
    """

    points: list[dict[str, Any]]
    grid_size: int
    searched: list[str]


def estimate_space(
    space: SearchSpace,
    shape: ModelShape,
    device: str = "cuda",
    *,
    longest_sample_tokens: int | None = None,
    data_tokens: int | None = None,
) -> SpaceEstimate:
    """Predict every memory-relevant point of ``space`` (:func:`grid_values` of each searched memory key, the other
    keys fixed), at most :data:`MAX_POINTS` of them (about 1 ms each), each at its worst step on data whose longest
    tokenized sample has ``longest_sample_tokens`` tokens (:meth:`TrialConfig.as_trained`; None: at
    ``max_seq_length``; a packed row at most ``data_tokens``, the data's tokens in all). Each point carries
    ``worst_case_length``, the tokens per row predicted.

    Raises:
        ValueError: A target module is not a projection of a Llama-style layer (the memory model knows only those);
            the message names them.
    """
    projections = shape.linear_shapes()
    unknown = sorted({m for v in grid_values(space, "target_modules") for m in v} - set(projections))
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)} is not a projection of a Llama-style layer; the memory model knows "
            f"{', '.join(projections)}"
        )
    keys = [k for k in MEMORY_KEYS if k in space.search]
    axes = [grid_values(space, k) for k in keys]
    points = []
    for combo in itertools.islice(itertools.product(*axes), MAX_POINTS):
        config = dataclasses.replace(space.base, **dict(zip(keys, combo)))
        trained = config.as_trained(longest_sample_tokens, data_tokens)
        estimate = estimate_memory(shape, settings_from(trained, space.model.attn_implementation, device))
        shown = {k: getattr(config, k) for k in ("per_device_train_batch_size", "max_seq_length", *keys)}
        points.append(
            {
                "params": shown,
                "worst_case_length": trained.max_seq_length,
                "predicted_peak_gib": round(estimate.predicted_peak_gib, 3),
                "terms_gib": {k: round(v, 4) for k, v in estimate.terms_gib.items()},
            }
        )
    points.sort(key=lambda p: float(p["predicted_peak_gib"]))  # type: ignore[arg-type]
    return SpaceEstimate(points=points, grid_size=math.prod(len(v) for v in axes), searched=keys)


#: Single changes that lower a configuration's memory, cheapest first (what they cost the training): checkpointing
#: costs time, double quant ~0.4 bit of precision in the constants, an 8-bit optimizer state precision, a smaller
#: batch is kept by gradient accumulation (export keeps the effective batch), shorter rows lose data, a smaller rank
#: or dropout off change the adapter.
_CHEAP_CHANGES: tuple[tuple[str, Callable[[Any], list[Any]]], ...] = (
    ("gradient_checkpointing", lambda v: [True] if v is False else []),
    ("bnb_4bit_use_double_quant", lambda v: [True] if v is False else []),
    ("optim", lambda v: ["paged_adamw_8bit"] if "8bit" not in str(v) else []),
    ("per_device_train_batch_size", lambda v: sorted({1, v // 2} - {v}, reverse=True) if v > 1 else []),
    ("max_seq_length", lambda v: [s for s in (v * 3 // 4, v // 2, v // 4, v // 8) if s >= 8]),
    ("r", lambda v: [x for x in (v // 2, v // 4, 1) if 1 <= x < v]),
    ("lora_dropout", lambda v: [0.0] if v else []),
)


#: Room on a measured peak before it becomes advice: the cap named is at least the measured peak times this, and at
#: least :data:`MEASURED_SLACK_GIB` above it. A CPU peak is a resident set, which also counts shared libraries; with
#: 5% the advice, followed exactly, ran out of memory on a loaded machine (issue 48: measured 1.22 GiB, advised 1.29,
#: the next run measured 1.35).
MEASURED_SLACK = 1.15
MEASURED_SLACK_GIB = 0.1


def nothing_fits(
    space: SearchSpace,
    predict: Callable[[TrialConfig], float | None],
    known_fit: bool = False,
    measure: Callable[[TrialConfig], tuple[float, float] | None] | None = None,
) -> str | None:
    """One line when no configuration of the space is predicted to fit, else None.

    The space's memory-relevant grid (:func:`grid_values`) is predicted with ``predict`` (a trial
    config dict to GiB: the memory model, corrected by the study's calibration where it has one) against
    ``memory_limit_gib * (1 + preflight_margin)``, the preflight's own bound. The line names the smallest predicted
    peak and the cheapest single setting that brings it under ``memory_limit_gib`` itself (:data:`_CHEAP_CHANGES`;
    the margin only forgives the model's error, advice should not lean on it), else the cap it would need: the
    smallest predicted peak, rounded up. ``known_fit``: the study already holds a trial that fit: say nothing.

    ``measure``: run the smallest configuration once and return ``(load_peak_gib, peak_gib)`` (None when it could
    not): on the CPU the cap also binds while the model loads, and the process's own resident memory is a measured
    quantity, not a modelled one. The advice then stands on the measurement: the cap it names is at least the
    measured peak times :data:`MEASURED_SLACK` and :data:`MEASURED_SLACK_GIB` above it (the line says so), and no
    setting is proposed when loading alone exceeds the cap.
    """
    if known_fit:
        return None
    limit_gib, margin = space.base.memory_limit_gib, space.base.preflight_margin
    bound = limit_gib * (1 + margin)
    smallest = smallest_predicted(space, predict, stop_at=bound)
    if smallest is None or smallest[0] <= bound:
        return None
    peak, values = smallest
    keys = [k for k in MEMORY_KEYS if k in space.search]
    shown = " ".join(f"{k}={getattr(values, k)}" for k in ("per_device_train_batch_size", "max_seq_length", *keys))
    shown = " ".join(dict.fromkeys(shown.split()))
    measured = measure(values) if measure is not None else None
    change = None if measured is not None and measured[0] > limit_gib else _cheapest_change(values, predict, limit_gib)
    room = (
        ""
        if measured is None
        else (
            f" (the measured peak + {MEASURED_SLACK - 1:.0%}, at least {MEASURED_SLACK_GIB:g} GiB: what a peak moves "
            "between runs)"
        )
    )
    needed = peak if measured is None else max(peak, max(measured) * MEASURED_SLACK, max(measured) + MEASURED_SLACK_GIB)
    needed = math.ceil(needed * 100) / 100  # a cap the peak fits (the margin only forgives the model's error)
    fix = (
        f"the cheapest setting to change: {change}, or memory_limit_gib >= {needed:.2f}{room}"
        if change
        else f"no single setting brings it under; raise memory_limit_gib to {needed:.2f} or more{room}"
    )
    seen = (
        f"; measured here, it peaked at {max(measured):.2f} GiB (loading {measured[0]:.2f} GiB)"
        if measured is not None
        else ""
    )
    return (
        f"{space.path}: training.memory_limit_gib: no configuration of the space is predicted to fit "
        f"{limit_gib:g} GiB (+ preflight_margin {margin:g}): the smallest predicted peak is {peak:.2f} GiB ({shown})"
        f"{seen}; {fix} ({space.command('estimate')}{' --device cpu' if measure is not None else ''}"
        + (": the memory model alone, before this measurement" if measured is not None else "")
        + ")"
    )


def smallest_predicted(
    space: SearchSpace, predict: Callable[[TrialConfig], float | None], stop_at: float = 0.0
) -> tuple[float, TrialConfig] | None:
    """The configuration of the space's memory-relevant grid (:func:`grid_values`, at most :data:`MAX_POINTS`, about
    1 ms each) with the smallest predicted peak, as ``(peak_gib, config)``; None when the model's shape is unknown
    (``predict`` returned None). ``stop_at`` (GiB): the first configuration predicted at or below it is returned at
    once (enough to know that something fits)."""
    keys = [k for k in MEMORY_KEYS if k in space.search]
    smallest: tuple[float, TrialConfig] | None = None
    for combo in itertools.islice(itertools.product(*[grid_values(space, k) for k in keys]), MAX_POINTS):
        values = dataclasses.replace(space.base, **dict(zip(keys, combo)))
        peak = predict(values)
        if peak is None:
            return None
        if smallest is None or peak < smallest[0]:
            smallest = (peak, values)
        if peak <= stop_at:
            break
    return smallest


def _cheapest_change(
    values: TrialConfig, predict: Callable[[TrialConfig], float | None], limit_gib: float
) -> str | None:
    """The first single change of :data:`_CHEAP_CHANGES` predicted to bring ``values`` under ``limit_gib``."""
    for key, options in _CHEAP_CHANGES:
        for option in options(getattr(values, key)):
            after = predict(dataclasses.replace(values, **{key: option}))
            if after is not None and after <= limit_gib:  # predicted to fit the cap itself, not only its margin
                return f"{key}: {yaml_value(option)} ({after:.2f} GiB)"
    return None
