"""The memory a trial measures phase by phase (:class:`PhasePeakMemory`) and a step's shape (:data:`StepShape`): the
typed readings both sides of the process boundary share, stored in a :class:`sweeper.trial._result.TrialResult`.

Imports neither torch nor optuna.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

#: A step's shape, ``(rows, tokens)``: one type on both sides of the process boundary (JSON stores it as a list).
StepShape = tuple[int, int]


def step_shape_of(value: Any) -> StepShape:
    """``[rows, tokens]`` read back from JSON or a user attribute, as :data:`StepShape`."""
    rows, tokens = value
    return int(rows), int(tokens)


@dataclass(frozen=True)
class PhasePeakMemory(Mapping[str, float]):
    """The peak memory of each phase a trial measured apart, in GiB (None: not measured in this trial); a mapping of
    the measured phases by name, in this order, which is how it is stored (``phase_peak_memory_gib``).

    Attributes:
        load: Loading, quantizing and attaching LoRA.
        train: The constant phase's training steps.
        worst_case: The worst-case step (one step of the data's longest rows, as the trial's collation builds it).
        probe: The probe's forwards (measured apart; never the judged peak).
        stress: The stress phase's steps (measured apart; never the judged peak).
    """

    load: float | None = None
    train: float | None = None
    worst_case: float | None = None
    probe: float | None = None
    stress: float | None = None

    #: The phases whose peak is the user's run's: a trial's ``peak_memory_gib`` is their maximum.
    JUDGED: ClassVar[tuple[str, ...]] = ("train", "worst_case")

    @classmethod
    def phases(cls) -> tuple[str, ...]:
        """Every phase's name, in order: ``load``, ``train``, ``worst_case``, ``probe``, ``stress``."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, peaks: Mapping[str, Any]) -> PhasePeakMemory:
        """The record of a mapping of phase peaks (as stored, or as measured); a phase this version does not know
        (a newer worker's) is left out."""
        return cls(**{p: float(peaks[p]) for p in cls.phases() if peaks.get(p) is not None})

    def __getitem__(self, phase: str) -> float:
        value = getattr(self, phase, None) if phase in self.phases() else None
        if value is None:
            raise KeyError(phase)
        return float(value)

    def __iter__(self) -> Iterator[str]:
        return (p for p in self.phases() if getattr(self, p) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
