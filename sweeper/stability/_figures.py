"""A trial's stability figures as every view holds them: :class:`StabilityFigures`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from sweeper.stability._headroom import Headroom


def _finite_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


@dataclass(frozen=True, kw_only=True)
class StabilityFigures:
    """A trial's stability figures as every view shows them: what its stress phase measured (:class:`Margin`'s
    fields) and the :class:`Headroom` that gives at its learning rate, flat, in the order of ``sweep report
    --json`` and the JSON export's ``provenance`` (``docs/contract.md``). Declared once here: the report's rows
    (``TrialRecord``, ``FrontRow``) and the export's ``Provenance`` each hold one and flatten it with :meth:`to_dict`.

    Attributes:
        stability_margin: How many times its learning rate the stress phase reached before diverging (> 1), None when
            not measured.
        margin_capped: The stress phase reached its cap without diverging: the margin is a lower bound (None: not
            measured).
        lr_ceiling: The learning rate the stress phase diverged at, None when it did not.
        predicted_max_lr: The largest constant learning rate a long run is predicted to hold at, or None.
        stability_margin_low, stability_margin_high: The margin's seed-noise interval (``high`` None when capped).
        predicted_max_lr_low, predicted_max_lr_high: ``predicted_max_lr``'s 95% interval (``high`` None when capped).
        predicted_max_lr_source: Which factor made ``predicted_max_lr`` (calibrated on this study, or not).
        headroom, headroom_low, headroom_high: ``predicted_max_lr / learning_rate`` and its 95% interval (``high``
            None when capped): how many times its own rate a long run is predicted to hold (:class:`Headroom`); None
            when not measured.
        near_edge: :attr:`Headroom.near_edge` (not called ``safe``); None when not measured.
        horizon_steps: The run length the chance is for (``study.confirm_steps``, else 400).
        p_diverge, p_diverge_low, p_diverge_high: The chance that a constant-rate run of ``horizon_steps`` steps at
            the trial's rate diverges, with its 95% interval (:class:`~sweeper.stability._chance.DivergenceChance`).
        stability_call: ``safe``, ``undecided``, ``likely fails``, or ``fails`` for a trial that itself went NaN or
            diverged; None when nothing says (an OOM, a trial not measured).
        safe_learning_rate: The largest rate whose chance's upper end is 5% at ``horizon_steps``.
    """

    stability_margin: float | None = None
    margin_capped: bool | None = None
    lr_ceiling: float | None = None
    predicted_max_lr: float | None = None
    stability_margin_low: float | None = None
    stability_margin_high: float | None = None
    predicted_max_lr_low: float | None = None
    predicted_max_lr_high: float | None = None
    predicted_max_lr_source: str | None = None
    headroom: float | None = None
    headroom_low: float | None = None
    headroom_high: float | None = None
    near_edge: bool | None = None
    horizon_steps: int | None = None
    p_diverge: float | None = None
    p_diverge_low: float | None = None
    p_diverge_high: float | None = None
    stability_call: str | None = None
    safe_learning_rate: float | None = None

    @classmethod
    def of(cls, stress: Any, headroom: Headroom | None, *, failed: bool = False) -> StabilityFigures:
        """The figures of ``stress`` (any object with :class:`Margin`'s fields: a stored ``StressOutcome``, a
        :class:`Margin`) and ``headroom`` (None: not measured, and then no chance either); ``failed``: the trial
        itself went NaN or diverged (its call ``fails``); a non-finite number becomes None."""
        chance = headroom is not None
        return cls(
            stability_margin=_finite_or_none(stress.stability_margin),
            margin_capped=stress.margin_capped,
            lr_ceiling=_finite_or_none(stress.lr_ceiling),
            predicted_max_lr=_finite_or_none(stress.predicted_max_lr),
            stability_margin_low=_finite_or_none(stress.stability_margin_low),
            stability_margin_high=_finite_or_none(stress.stability_margin_high),
            predicted_max_lr_low=_finite_or_none(stress.predicted_max_lr_low),
            predicted_max_lr_high=_finite_or_none(stress.predicted_max_lr_high),
            predicted_max_lr_source=stress.predicted_max_lr_source,
            headroom=None if headroom is None else _finite_or_none(headroom.value),
            headroom_low=None if headroom is None else _finite_or_none(headroom.low),
            headroom_high=None if headroom is None else _finite_or_none(headroom.high),
            near_edge=None if headroom is None else headroom.near_edge,
            horizon_steps=getattr(stress, "horizon_steps", None) if chance else None,
            p_diverge=_finite_or_none(getattr(stress, "p_diverge", None)) if chance else None,
            p_diverge_low=_finite_or_none(getattr(stress, "p_diverge_low", None)) if chance else None,
            p_diverge_high=_finite_or_none(getattr(stress, "p_diverge_high", None)) if chance else None,
            stability_call="fails" if failed else getattr(stress, "stability_call", None) if chance else None,
            safe_learning_rate=_finite_or_none(getattr(stress, "safe_learning_rate", None)) if chance else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields in order, as plain values (the keys of the JSON contract)."""
        return asdict(self)
