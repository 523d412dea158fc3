"""Headroom: how many times its own learning rate a trial's long run is predicted to hold."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sweeper.stability._margin import DEFAULT_LR_CALIBRATION

#: The least headroom (``predicted_max_lr / learning_rate``) at which a trial whose ``predicted_max_lr`` is
#: uncalibrated counts as safely below its edge, whatever its interval says: the issue that asked for headroom set it,
#: and the built-in factor's own 95% spread (``1.51**1.96`` = 2.24) already asks for more. A study's own calibration
#: (``sweep calibrate``) may allow less: its trials need only their interval's low end above their rate.
MIN_UNCALIBRATED_HEADROOM = 2.0


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """How many times its own learning rate a trial's long run is predicted to hold: ``predicted_max_lr /
    learning_rate``, with the 95% interval of ``predicted_max_lr`` (:func:`predicted_max_lr`) divided alike. A
    user's question, "can I train this at my rate, and how much room is there", in the user's units.

    Attributes:
        value: ``predicted_max_lr / learning_rate`` (> 0); a lower bound when ``capped``.
        low: The low end of its 95% interval.
        high: The high end, None when ``capped`` (the stress phase reached its cap: no upper end).
        capped: The stress phase reached its cap without diverging.
        calibrated: ``predicted_max_lr`` came from the study's own factor (``sweep calibrate``), not the built-in one.
        call: The chance of diverging's call (``safe``, ``undecided``, ``likely fails``:
            :class:`~sweeper.stability._chance.DivergenceChance`), None for a trial stored without one (an older
            version).
    """

    value: float
    low: float
    high: float | None
    capped: bool
    calibrated: bool
    call: str | None = None

    @property
    def safety_factor(self) -> float:
        """The headroom below which the trial is :attr:`near_edge`: the factor from ``value`` down to the interval's
        low end (``gsd**1.96`` of its calibration), and at least :data:`MIN_UNCALIBRATED_HEADROOM` when
        uncalibrated."""
        spread = self.value / self.low if self.low > 0 else math.inf
        return max(spread, MIN_UNCALIBRATED_HEADROOM) if not self.calibrated else spread

    @property
    def near_edge(self) -> bool:
        """Whether a long run at the trial's own rate is not called ``safe``: its :attr:`call` is ``undecided`` or
        ``likely fails``; without a call (a trial stored before issue 66), ``value`` below :attr:`safety_factor`."""
        if self.call is not None:
            return self.call != "safe"
        return self.value < self.safety_factor * (1 - 1e-9)


def headroom_of(learning_rate: float | None, stress: Any) -> Headroom | None:
    """The :class:`Headroom` of a trial trained at ``learning_rate`` whose stress phase measured ``stress`` (any
    object with ``predicted_max_lr``, ``predicted_max_lr_low``, ``predicted_max_lr_high``, ``margin_capped`` and
    ``predicted_max_lr_calibrated``, and ``stability_call`` where it has one: a :class:`Margin`, a stored
    ``StressOutcome``); None when either is unknown. A prediction stored without its interval gets the built-in
    spread."""
    predicted = getattr(stress, "predicted_max_lr", None)
    if learning_rate is None or not learning_rate > 0 or predicted is None or not math.isfinite(predicted):
        return None
    capped = bool(getattr(stress, "margin_capped", False))
    low = getattr(stress, "predicted_max_lr_low", None)
    high = getattr(stress, "predicted_max_lr_high", None)
    if low is None:
        low = predicted / DEFAULT_LR_CALIBRATION.spread
        high = None if capped else predicted * DEFAULT_LR_CALIBRATION.spread
    return Headroom(
        value=predicted / learning_rate,
        low=low / learning_rate,
        high=None if capped or high is None else high / learning_rate,
        capped=capped,
        calibrated=bool(getattr(stress, "predicted_max_lr_calibrated", False)),
        call=getattr(stress, "stability_call", None),
    )
