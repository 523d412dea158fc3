"""What ``sweep confirm`` and ``sweep calibrate`` print as their long runs go (:class:`ConfirmConsole`, a
:class:`sweeper.sweep.ConfirmCallback`; :class:`CalibrateConsole`, a :class:`sweeper.sweep.CalibrationCallback`), as
:class:`sweeper.cli._sweep_console.SweepConsole` does for a sweep: the lines go above the live display."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sweeper.notation import format_chance
from sweeper.report import LiveProgress, format_instability, format_params, margin_text, predicted_text
from sweeper.report.text import format_duration
from sweeper.stability import StabilityFigures, derive_margin_figures
from sweeper.study import Confirmation, StoredTrial, StudySnapshot
from sweeper.sweep import CalibrationCallback, ConfirmCallback, EdgeRun
from sweeper.trial import TrialProgress

#: The settings a confirmation's line names when the study does not say which it searched.
_DEFAULT_SHOWN = ("r", "lora_alpha_ratio", "bnb_4bit_compute_dtype")


class ConfirmConsole(ConfirmCallback):
    """The confirmations' lines and live display; counts what failed and what could not run.

    Attributes:
        failed: Confirmations that failed (their configuration does not hold at the horizon), skipped ones counted.
        not_run: Runs that could not run to an outcome (a failure of the attempt: nothing recorded).
    """

    def __init__(self, runs: int, searched: Sequence[str], as_exported: bool) -> None:
        self.live = LiveProgress(runs, label="confirmations")
        self.searched = list(searched) or list(_DEFAULT_SHOWN)
        self.as_exported = as_exported
        self.failed = self.not_run = 0

    def confirmation_started(self, trial: StoredTrial, steps: int) -> None:
        assert trial.config is not None
        own, exported = trial.config.effective_batch_size, trial.config.as_exported().effective_batch_size
        if self.as_exported:
            batch = f"effective batch {exported}, as exported (the trial ran {own})"
        elif exported != own:
            batch = f"effective batch {own}, the trial's; the export trains at {exported}: --as-exported runs that"
        else:
            batch = f"effective batch {own}, as exported"
        shown = format_params({k: trial.params.get(k) for k in self.searched if k in trial.params})
        self.live.line(
            f"confirm #{trial.number:<3} {shown}: {steps} steps (the trial ran {trial.config.max_steps}), {batch}"
            + _eta(trial, steps, exported / own if self.as_exported else 1.0)
        )
        self.live.begin(0, trial.number, "confirm")

    def confirmation_progress(self, trial: StoredTrial, progress: TrialProgress) -> None:
        self.live.report(0, progress)

    def confirmation_finished(self, trial: StoredTrial, confirmation: Confirmation) -> None:
        self.live.end(0)
        if not confirmation.is_outcome:
            self.not_run += 1
            earlier = trial.confirmation
            self.live.line(
                f"        #{trial.number:<3} could not run its confirmation ({confirmation.status} at step "
                f"{confirmation.fail_step}: {confirmation.reason}): a failure of the attempt, not of the "
                "configuration, so it is not recorded as its outcome"
                + (f" (its {earlier.steps}-step confirmation stands)" if earlier is not None else "")
                + "; fix it and run the same command"
            )
            return
        self.failed += 0 if confirmation.passed else 1
        self.live.line(outcome_line(trial, confirmation))

    def confirmation_skipped(self, trial: StoredTrial, earlier: Confirmation) -> None:
        self.failed += 0 if earlier.passed else 1
        self.live.end_trial(trial.number)
        self.live.line(f"confirm #{trial.number:<3} already confirmed at {earlier.steps} steps: {earlier.label}")

    def close(self) -> None:
        """End the live display."""
        self.live.close()


def _eta(trial: StoredTrial, steps: int, batch_ratio: float) -> str:
    """``; about 4 min at the trial's 1.9 s a step``: the confirmation's expected training time, the trial's own
    seconds per constant step (``train_time_s / steps_done``, its probe included) times ``steps``, scaled by the
    effective batch's ratio when it trains another (``--as-exported``); loading comes on top. Empty when the trial
    has no time per step."""
    constant = trial.result.constant
    if not constant.train_time_s or not constant.steps_done:
        return ""
    per_step_s = constant.train_time_s / constant.steps_done * batch_ratio
    return f"; about {format_duration(per_step_s * steps)} at the trial's {per_step_s:.2g} s a step, plus loading"


def _chance_at(trial: StoredTrial, steps: int) -> str:
    """``P(diverges within 60 steps) <0.1% safe``: the trial's chance at a confirmation's length (or, in a study
    calibrated by ``sweep calibrate``, its ``predicted_max_lr`` with the interval the confirmation was judged by)."""
    stress = trial.result.stress
    if stress.predicted_max_lr_calibrated or trial.config is None:
        return f"predicted_max_lr {predicted_text(stress)}"
    at = replace(stress)
    derive_margin_figures(at, trial.config.learning_rate, None, steps)
    return f"P(diverges within {steps} steps) {format_chance(StabilityFigures.of(at, trial.headroom))}"


def outcome_line(trial: StoredTrial, done: Confirmation) -> str:
    """The line of a confirmation that ended with an outcome: confirmed or FAILED, with what the trial's margin had
    predicted."""
    peak = "-" if done.peak_memory_gib is None else f"{done.peak_memory_gib:.2f} GiB"
    margin = margin_text(trial.result.stress)
    said = ""
    if done.predicted_to_hold is not None and done.predicted_max_lr is not None:
        said = (
            f"; its margin {margin} said it {'holds' if done.predicted_to_hold else 'fails'} "
            f"({_chance_at(trial, done.steps)}): " + ("as predicted" if done.margin_held else "NOT as predicted")
        )
    elif done.left_open:
        said = (
            f"; its margin {margin} left it open ({_chance_at(trial, done.steps)}), where either outcome is within "
            "the prediction"
        )
    if done.passed:
        return (
            f"        #{trial.number:<3} confirmed: {done.steps} steps complete, instability "
            f"{format_instability(done.instability)} (short "
            f"{format_instability(trial.result.constant.instability)}), peak {peak} "
            f"({done.wall_time_s or 0:.0f} s){said}"
        )
    return (
        f"        #{trial.number:<3} FAILED its confirmation: {done.status} at step {done.fail_step} of "
        f"{done.steps}: {done.reason} ({done.wall_time_s or 0:.0f} s){said}"
    )


class CalibrateConsole(CalibrationCallback):
    """The calibration runs' lines and live display."""

    def __init__(self, runs: int) -> None:
        self.live = LiveProgress(runs, label="calibration runs")

    def run_started(self, trial: StoredTrial, multiple: float, steps: int) -> None:
        assert trial.config is not None
        rate = trial.config.learning_rate * multiple
        self.live.line(f"calibrate #{trial.number:<3} {steps} steps at {multiple:g}x its learning rate ({rate:.3g})")
        self.live.begin(0, trial.number, "calibrate")

    def run_progress(self, trial: StoredTrial, progress: TrialProgress) -> None:
        self.live.report(0, progress)

    def run_finished(self, trial: StoredTrial, run: EdgeRun) -> None:
        self.live.end(0)
        if run.is_outcome:
            how = f"{run.status} at step {run.fail_step}" if run.failed else "held"
        else:
            how = f"{run.status} at step {run.fail_step}: says nothing about the edge; the calibration stops here"
        self.live.line(f"          #{trial.number:<3} {run.multiple:g}x: {how}")

    def close(self) -> None:
        """End the live display."""
        self.live.close()


def calibration_lines(study: StudySnapshot, calibration: Any, edges: Sequence[Any], runs: int) -> list[str]:
    """What ``sweep calibrate`` ends with: each bracketed edge, the study's factor with its spread and source, and
    the front's first three ``predicted_max_lr`` under it (``study`` read after it was stored); or, with no
    ``calibration`` yet, that the runs so far are kept."""
    if calibration is None:
        return [
            f"calibrate: no edge bracketed yet within {runs} runs; run the same command again to go on (the runs so "
            "far are kept)"
        ]
    lines = [
        f"edge    #{e.trial:<3} held {e.held:g}x, failed {e.failed:g}x its learning rate: edge {e.edge_lr:.3g}, "
        f"{e.factor:.3g} x its lr_ceiling {e.lr_ceiling:.3g}"
        for e in edges
    ]
    lines.append(
        f"factor  {calibration.factor:.3g} (geometric SD {calibration.gsd:.2f}; a prediction's 95% interval is x/"
        f"{calibration.spread:.2g}): {calibration.source}; every predicted_max_lr of {study.name} now uses it"
    )
    front = study.front[:3]
    return lines + [f"        #{t.number:<3} predicted_max_lr {predicted_text(t.result.stress)}" for t in front]
