"""The stress phase (child side): :class:`Stress`, an LR range test after the constant phase (:mod:`sweeper.stability`):
stress step ``j`` trains at ``growth**j`` times the trial's learning rate, the probe is read after each, and the
step at which the probe shows the edge gives the stability margin and the chance of diverging.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

from sweeper.space import TrialConfig
from sweeper.stability import STRESS_GROWTH, divergence, margin_of, stress_lr
from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.instruments.probe import ProbeInstrument
from sweeper.trial._child.memory import is_oom
from sweeper.trial._child.record import DivergedError, NonFiniteError, finite_or_none
from sweeper.trial._job import Measures
from sweeper.trial._result import StressOutcome, TrialResult
from sweeper.trial._status import TrialStatus


class StressOverflow(Exception):
    """The fp16 loss scaler skipped a stress step: its gradients overflowed at that learning rate."""


@dataclass
class StressPhase:
    """The stress phase's record: stress step ``j`` (1-based, optimizer step ``after_step + j``) trains at
    ``learning_rate * growth**j``, and the probe is read after each.

    Attributes:
        after_step: The constant phase's last optimizer step (``max_steps``).
        steps: Stress steps at most (the job's :class:`~sweeper.trial._job.StressSettings`).
        learning_rate: The trial's learning rate (the constant phase's).
        growth: The learning rate's factor per stress step (the job's).
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


class Stress(Instrument):
    """The stress phase (``Measures.stress``; None: a constant-rate run only). It reads the probe after each step,
    so without a probe it does not run. When the constant phase ends it closes the trial's training time and
    measures its own memory as the ``stress`` phase; what ends it (the edge, the cap, an error) is a measurement,
    never the trial's failure (:meth:`end`).

    Attributes:
        phase: Its record (None: it does not run).
    """

    name = "stress"

    def __init__(self) -> None:
        super().__init__()
        self.phase: StressPhase | None = None
        self.probe: ProbeInstrument | None = None

    @classmethod
    def wanted(cls, measures: Measures) -> bool:
        """Unless the job turned it off."""
        return measures.stress is not None

    def arm(self, arming: Arming) -> int:
        """Its phase, after the probe's (it needs one); returns its steps at most."""
        super().arm(arming)
        trial, settings = arming.trial, arming.trial.measures.stress
        probe = arming.armed.get(ProbeInstrument.name)
        if settings is None or not isinstance(probe, ProbeInstrument) or probe.probe is None:
            return 0
        self.probe, self.measured, self.progress = probe, trial.measured, trial.progress
        config = trial.config
        self.phase = StressPhase(
            after_step=config.max_steps,
            steps=settings.steps,
            learning_rate=config.learning_rate,
            growth=settings.growth,
        )
        return settings.steps

    def schedule(self) -> tuple[int, float] | None:
        """``(max_steps, growth)``: the stress steps' learning rates."""
        return (self.phase.after_step, self.phase.growth) if self.phase is not None else None

    def on_step_begin(self, args, state, control, **kwargs):
        """Begin with the first step after the constant phase's last (whose every instrument, its last probe
        included, has run: an instrument after this one in the list still sees that step as the constant
        phase's)."""
        if self.phase is not None and not self.record.stressing and state.global_step >= self.phase.after_step:
            self._begin()

    def on_step_end(self, args, state, control, **kwargs):
        """Each step after the constant phase is a stress step: recorded, and the probe read after it."""
        if self.phase is not None and self.record.stressing:
            self._step_end()

    def _begin(self) -> None:
        """The constant phase has ended: its training time is the trial's, and the stress phase's memory is measured
        apart from it."""
        measured = self.measured
        if measured.train_start is not None:
            measured.train_time_s = time.monotonic() - measured.train_start
        self.record.enter_memory_phase("stress")
        self.record.stressing = True
        assert self.phase is not None
        self.phase.started = time.monotonic()

    def _step_end(self) -> None:
        """Record a finished stress step and probe after it; raises when it showed the edge."""
        record, phase, probe = self.record, self.phase, self.probe
        assert phase is not None and probe is not None and probe.probe is not None
        accelerator = self.trainer.accelerator
        skipped = bool(accelerator.scaler is not None and accelerator.optimizer_step_was_skipped)
        phase.done += 1
        phase.lr.append(stress_lr(phase.learning_rate, phase.done, phase.growth))
        phase.loss.append(finite_or_none(record.step_loss))
        record.step_batches = []
        if skipped:
            raise StressOverflow(f"the fp16 loss scaler skipped stress step {phase.done}")
        if not math.isfinite(record.step_grad_norm):
            raise NonFiniteError("gradient norm", record.step_grad_norm, "backward")
        phase.probe_loss.append(finite_or_none(probe.measure()))
        # its own trace, read with the constant phase's before it
        steps = probe.steps + [phase.after_step + j for j in range(1, phase.done + 1)]
        found = divergence(steps, probe.loss + phase.probe_loss, final=phase.done >= phase.steps)
        if found is not None:
            raise DivergedError(found)
        self.progress.report("stress", step=phase.done, of=phase.steps, loss=record.step_loss)

    def end(self, exc: BaseException | None) -> bool:
        """Close the stress phase that ``exc`` ended (None: it reached its cap); True when the process is as fit for
        another trial as after a complete one (not after an out-of-memory error or another failure)."""
        phase = self.phase
        assert phase is not None
        phase.time_s = time.monotonic() - (phase.started or time.monotonic())
        fit = True
        if exc is None:
            phase.stop = "cap"
        elif isinstance(exc, DivergedError):
            phase.stop, phase.stop_step = "diverged", exc.divergence.first_step - phase.after_step
        elif isinstance(exc, NonFiniteError) and exc.what != "input id":
            phase.stop, phase.stop_step = "nan", phase.done + (0 if exc.what == "gradient norm" else 1)
        elif isinstance(exc, StressOverflow):
            phase.stop, phase.stop_step = "overflow", phase.done
        else:
            phase.stop, fit = ("oom" if is_oom(exc) else "error"), False
            print(f"sweeper: the stress phase ended in {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return fit

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """The margin and its traces, for a trial that completed its constant phase."""
        if self.phase is None or not self.record.stressing or result.status is not TrialStatus.COMPLETE:
            return
        result.stress = self.phase.outcome(result.constant.train_time_s)
