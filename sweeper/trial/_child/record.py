"""What a trial records while it trains, and how training stops early (child side, imports no torch): the per-step
:class:`TrainingRecord`, the :class:`Probe` it evaluates, and the two exceptions that end a run before ``max_steps``,
:class:`NonFiniteError` (``nan``) and :class:`DivergedError` (``diverged``). Written by the instrumented trainer
(:mod:`sweeper.trial._child.instrumented`), read by the outcome (:mod:`sweeper.trial._child.outcome`) and the NaN
diagnosis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sweeper.stability import STRESS_GROWTH, Divergence, margin_of
from sweeper.trial._memory_phases import StepShape
from sweeper.trial._result import FailPhase, StressOutcome


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
        # The probe (sweeper.stability): its steps, losses and largest 4-bit activations, and the seconds it took.
        self.probing = False
        self.probe_steps: list[int] = []
        self.probe_loss: list[float | None] = []
        self.probe_max_activation: list[float | None] = []
        self.probe_step_max_activation: Any = None
        self.probe_time_s = 0.0
        # Seconds the worst-case step took (sweeper.trial._child.instrumented.run_worst_case_step): an instrument's,
        # taken out of the constant phase's training time.
        self.worst_case_time_s = 0.0
        # The adapters' update-to-weight ratio at each constant-phase probe, and the base weights' norm it divides by.
        self.update_ratio: list[float | None] = []
        self.base_weight_norm: float | None = None
        # The stress phase after the constant one (the job's StressSettings), None when there is none.
        self.stress: StressPhase | None = None
        # The peak memory of each phase (sweeper.trial._child.memory.PhasePeaks), set by the recipe; the worst-case
        # step (its batch, set by the recipe; its shape [b, s] once it ran; True while it runs).
        self.peaks: Any = None
        self.worst_case_batch: dict[str, Any] | None = None
        self.worst_case_shape: StepShape | None = None
        # ...its rows' dataset indices (set with its batch) and, once it ran, the tokens its loss was computed on.
        self.worst_case_rows: list[int] = []
        self.worst_case_supervised_tokens: int | None = None
        self.in_worst_case = False
        # The critical learning rate's line searches (sweeper.trial._child.line_search): the steps before whose
        # update they run, their readings (step, row, multiple, censored), forwards, seconds, why one did not run,
        # the multiple the next starts from, and True while one runs.
        self.line_search_steps: list[int] = []
        self.line_search_readings: list[tuple[int, int, float, bool]] = []
        self.line_search_step_readings: list[tuple[int, int, float, bool]] = []  # on the step's own micro-batches
        self.line_search_forwards = 0
        self.line_search_time_s = 0.0
        self.line_search_skipped: str | None = None
        self.line_search_start = 1.0
        self.in_line_search = False

    def enter_memory_phase(self, phase: str) -> str | None:
        """Start measuring the peak of ``phase`` (:class:`~sweeper.trial._child.memory.PhasePeaks`); returns the
        phase closed, None when nothing was measured or there are no phase peaks."""
        return self.peaks.enter(phase) if self.peaks is not None else None

    @property
    def stressing(self) -> bool:
        """The constant phase has ended and the stress phase runs: steps go to :attr:`stress`, not the traces."""
        return self.stress is not None and self.stress.active


@dataclass
class StressPhase:
    """The stress phase's record (an LR range test after the constant phase, :mod:`sweeper.stability`): stress step
    ``j`` (1-based, optimizer step ``after_step + j``) trains at ``learning_rate * growth**j``, and the probe is read
    after each.

    Attributes:
        after_step: The constant phase's last optimizer step (``max_steps``).
        steps: Stress steps at most (the job's :class:`~sweeper.trial._job.StressSettings`).
        learning_rate: The trial's learning rate (the constant phase's).
        growth: The learning rate's factor per stress step (the job's).
        active: The constant phase has ended.
        done: Stress steps finished.
        lr, loss, probe_loss: Per finished stress step: its learning rate, training loss and the probe loss after it
            (None where non-finite).
        stop: How it ended (:data:`sweeper.stability._margin.STRESS_STOPS`), None while it runs.
        stop_step: The 1-based stress step that showed the edge (``diverged``: the first probe at or above the ratio).
        started: ``time.monotonic()`` when it began.
        time_s: Seconds it took (its probes included).
    """

    after_step: int
    steps: int
    learning_rate: float
    growth: float = STRESS_GROWTH
    active: bool = False
    done: int = 0
    lr: list[float] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    probe_loss: list[float | None] = field(default_factory=list)
    stop: str | None = None
    stop_step: int | None = None
    started: float | None = None
    time_s: float | None = None

    def outcome(self, train_time_s: float | None) -> StressOutcome:
        """What the result stores of this phase: its margin at the trial's learning rate
        (:func:`sweeper.stability.margin_of`), its stop, steps finished, traces and seconds, and its cost as a share
        of ``train_time_s`` (the constant phase's seconds; no share without them).

        Raises:
            ValueError: ``stop`` is none of :data:`sweeper.stability._margin.STRESS_STOPS`.
        """
        margin = margin_of(self.learning_rate, self.stop, self.stop_step, growth=self.growth, steps=self.steps)
        return StressOutcome(
            lr_ceiling=margin.lr_ceiling,
            stability_margin=margin.stability_margin,
            margin_capped=margin.margin_capped,
            predicted_max_lr=margin.predicted_max_lr,
            stability_margin_low=margin.stability_margin_low,
            stability_margin_high=margin.stability_margin_high,
            predicted_max_lr_low=margin.predicted_max_lr_low,
            predicted_max_lr_high=margin.predicted_max_lr_high,
            predicted_max_lr_source=margin.predicted_max_lr_source,
            predicted_max_lr_calibrated=margin.predicted_max_lr_calibrated,
            horizon_steps=margin.horizon_steps,
            p_diverge=margin.p_diverge,
            p_diverge_low=margin.p_diverge_low,
            p_diverge_high=margin.p_diverge_high,
            stability_call=margin.stability_call,
            safe_learning_rate=margin.safe_learning_rate,
            stop=self.stop,
            steps=self.done,
            lr_trace=self.lr,
            loss_trace=self.loss,
            probe_loss_trace=self.probe_loss,
            time_s=self.time_s,
            time_share=self.time_s / train_time_s if self.time_s is not None and train_time_s else None,
        )


class StressOverflow(Exception):
    """The fp16 loss scaler skipped a stress step: its gradients overflowed at that learning rate."""


class DivergedError(Exception):
    """The probe loss rose to :data:`sweeper.stability._instability.DIVERGED_RATIO` times its start and stayed there.

    Attributes:
        divergence: The step and the evidence.
    """

    def __init__(self, found: Divergence):
        self.divergence = found
        super().__init__(found.reason)


@dataclass(frozen=True)
class Probe:
    """The fixed rows the trial evaluates without an update (see :mod:`sweeper.stability`).

    Attributes:
        batches: The probe rows collated as training collates them (model inputs only), each batch evaluated in one
            forward without gradients; the probe loss is the mean over all their supervised tokens. One batch of
            every row when the trial's micro-batch holds at least as many rows (each forward dequantizes every 4-bit
            weight once, which at short lengths costs more than the rows themselves); one batch per row at a smaller
            micro-batch, so that the probe never processes more tokens in one forward than a training step does.
        interval_steps: Optimizer steps between probes (:func:`sweeper.stability.probe_interval_steps`).
        max_steps: The run's last step, which is always probed.
    """

    batches: list[dict[str, Any]]
    interval_steps: int
    max_steps: int


def finite_or_none(x: float | None) -> float | None:
    """``x`` when it is a finite number, else None (how a trace stores a non-finite value)."""
    return x if x is not None and math.isfinite(x) else None
