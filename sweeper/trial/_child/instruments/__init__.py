"""A trial's instruments: what it measures besides its training, one module each, each a
``transformers.TrainerCallback`` (:class:`~sweeper.trial._child.instruments._base.Instrument`), in the order their
hooks run:

- :mod:`.phase_memory`: each phase's peak memory, and the CPU cap at each step's end;
- :mod:`.traces`: the per-step traces and progress lines;
- :mod:`.worst_case`: the worst-case step after step 1;
- :mod:`.probe`: the probe, the instability and the learning progress;
- :mod:`.stress`: the stress phase, the margin and the chance of diverging;
- :mod:`.critical_lr`: experimental, the critical learning rate's line searches.

The recipe reads :data:`INSTRUMENTS` (through :func:`make_instruments`) and never names one, but for the memory
phases it starts once loading ended and the stress phase's end it closes.
"""

from __future__ import annotations

from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.instruments.critical_lr import CriticalLr
from sweeper.trial._child.instruments.phase_memory import PhaseMemory
from sweeper.trial._child.instruments.probe import ProbeInstrument
from sweeper.trial._child.instruments.stress import Stress, StressOverflow
from sweeper.trial._child.instruments.traces import Traces, track_activations
from sweeper.trial._child.instruments.worst_case import WorstCase

#: Every instrument, in the order they are armed and their hooks run (an instrument armed later may read one armed
#: before: the stress phase and the line search read the probe's rows).
INSTRUMENTS: list[type[Instrument]] = [PhaseMemory, Traces, WorstCase, ProbeInstrument, Stress, CriticalLr]


def register_instrument(kind: type[Instrument]) -> None:
    """Add an instrument after the others (peft's ``register_peft_method``'s way: one call joins it).

    Raises:
        ValueError: An instrument of that name is already registered.
    """
    if any(k.name == kind.name for k in INSTRUMENTS):
        raise ValueError(f"an instrument named {kind.name!r} is already registered")
    INSTRUMENTS.append(kind)


def make_instruments(measures) -> list[Instrument]:
    """One of each registered instrument the job's :class:`~sweeper.trial._job.Measures` wants, in order."""
    return [kind() for kind in INSTRUMENTS if kind.wanted(measures)]


__all__ = [
    "INSTRUMENTS",
    "Arming",
    "Instrument",
    "StressOverflow",
    "make_instruments",
    "register_instrument",
    "track_activations",
]
