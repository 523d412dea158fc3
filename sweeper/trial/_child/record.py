"""What a trial records while it trains, and how training stops early (child side, imports no torch): the per-step
:class:`TrainingRecord` (each instrument keeps its own record, :mod:`sweeper.trial._child.instruments`), and the two
exceptions that end a run before ``max_steps``,
:class:`NonFiniteError` (``nan``) and :class:`DivergedError` (``diverged``). Written by the instrumented trainer
(:mod:`sweeper.trial._child.instrumented`), read by the outcome (:mod:`sweeper.trial._child.outcome`) and the NaN
diagnosis.
"""

from __future__ import annotations

import math
from typing import Any

from sweeper.stability import Divergence
from sweeper.trial._result import FailPhase


class NonFiniteError(Exception):
    """The loss or gradient norm of a step is NaN or infinite, or an input id has no embedding row (which would be
    an index error on the CPU and a device-side assert on CUDA, so it is stopped before the forward).

    Attributes:
        what: ``loss``, ``gradient norm`` or ``input id``.
        value: The offending value.
        fail_phase: ``forward`` or ``backward``: the part of the step it was found in (:data:`sweeper.trial._result.
            FailPhase`).
        diagnosis: Set by the recipe (:mod:`sweeper.trial._child.recipe`) once
            :func:`sweeper.trial._child.diagnosis.diagnose_nan` has run.
    """

    def __init__(self, what: str, value: float, fail_phase: FailPhase):
        self.what, self.value, self.fail_phase = what, value, fail_phase
        self.diagnosis: Any = None
        super().__init__(f"{what} is {value}")

    def describe(self, step: int) -> str:
        """``loss is nan at step 3 (forward)``."""
        if self.what == "input id":
            return f"input id {self.value:g} has no embedding row at step {step} ({self.fail_phase})"
        return f"{self.what} is {self.value} at step {step} ({self.fail_phase})"


class TrainingRecord:
    """What the instrumented Trainer records of one trial, step by step (not a progress display): the part of the step
    being run (``fail_phase``: what a failure is attributed to), optimizer steps finished, per-step traces (raw loss,
    pre-clip gradient norm, largest 4-bit activation, supervised tokens), fp16 scaler skips, and the micro-batches of
    the current and last step for the NaN diagnosis. Shared by the trainer hooks and the outcome of
    :mod:`sweeper.trial._child.worker`."""

    def __init__(self) -> None:
        self.fail_phase: FailPhase = "load"
        self.step = 0  # optimizer steps finished
        self.loss: list[float | None] = []
        self.grad_norm: list[float | None] = []
        self.max_activation: list[float | None] = []
        self.skipped: list[int] = []
        self.tokens = 0  # the data's own tokens the constant phase's steps processed
        self.processed_tokens = 0  # every token they processed, padding included
        self.step_loss = 0.0
        self.step_grad_norm = float("nan")
        self.step_max_activation: Any = None
        # For NaN diagnosis and the data attributes: the current and the last finished step's micro-batches (CPU
        # copies, with their dataset indices), supervised tokens per step, and every sample index trained on.
        self.step_batches: list[dict[str, Any]] = []
        self.last_batches: list[dict[str, Any]] = []
        self.supervised: list[int] = []
        self.step_supervised: int | None = None
        self.seen: set[int] = set()
        # The phase peaks (sweeper.trial._child.memory.PhasePeaks), set by the phase-memory instrument once loading
        # ended; the instrument whose work runs now (sweeper.trial._child.instruments: the activation hook and a
        # failure's outcome read it), None while the trainer trains; the stress phase runs (steps are not the traces').
        self.peaks: Any = None
        self.running: Any = None
        self.stressing = False

    def enter_memory_phase(self, phase: str) -> str | None:
        """Start measuring the peak of ``phase`` (:class:`~sweeper.trial._child.memory.PhasePeaks`); returns the
        phase closed, None when nothing was measured or there are no phase peaks."""
        return self.peaks.enter(phase) if self.peaks is not None else None


class DivergedError(Exception):
    """The probe loss rose to :data:`sweeper.stability._instability.DIVERGED_RATIO` times its start and stayed there.

    Attributes:
        divergence: The step and the evidence.
    """

    def __init__(self, found: Divergence):
        self.divergence = found
        super().__init__(found.reason)


def finite_or_none(x: float | None) -> float | None:
    """``x`` when it is a finite number, else None (how a trace stores a non-finite value)."""
    return x if x is not None and math.isfinite(x) else None
