"""What ``sweep run`` prints: the header of a planned sweep, one line per trial as it ends (:class:`SweepConsole`,
a :class:`sweeper.sweep.SweepCallback`), and the summary after the last one. Text only: the command decides where
it goes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from sweeper.devices import cuda_visible
from sweeper.memory import median_abs
from sweeper.report import LiveProgress
from sweeper.report.text import (
    format_counts,
    format_data_nan_summary,
    format_front,
    format_params,
    front_axis,
    legacy_instability_warning,
    picks_block,
    plural,
    worst_case_data_line,
)
from sweeper.report.text import format_trial_line as _trial_line
from sweeper.storage import TrialAttr, redact_url
from sweeper.study import StoredTrial, StudySnapshot, snapshot, stored_calibration
from sweeper.sweep import SweepCallback, SweepEvent, SweepPlan
from sweeper.trial import FAIL_STATUSES, TrialProgress, TrialStatus


def sweep_header(plan: SweepPlan) -> list[str]:
    """The first lines of ``sweep run``: the study, its storage (password redacted), the trial target and the
    searched keys; with several workers or ``--devices``, where the trials run."""
    lines = [
        f"sweep: study '{plan.name}' in {redact_url(plan.storage)}, {plural(plan.n_trials, 'trial')}, "
        f"searching {', '.join(plan.space.search)}"
    ]
    on_devices = any(d is not None for d in plan.devices)  # --devices was given
    if plan.workers > 1 or on_devices:
        if on_devices:
            shown = ", ".join(f"device {d}" if d is not None else "this machine" for d in plan.devices)
        else:
            threads = max(1, (os.cpu_count() or 1) // plan.workers)
            shown = f"on the CPU, {threads} thread{'s' if threads > 1 else ''} each"
        lines.append(f"workers {plan.workers} trial{'s' if plan.workers > 1 else ''} at once ({shown})")
        if on_devices and not cuda_visible():
            lines.append("note    --devices names GPUs, but none is visible here: the trials run on the CPU")
    return lines


def resume_lines(plan: SweepPlan) -> list[str]:
    """Before the first trial of a resumed study: what it holds, trials measured under another
    ``memory_limit_gib``, trials whose instability was computed the old way, and that nothing is left to run."""
    lines = []
    read = snapshot(plan.study)
    already, limit_gib = plan.finished_before, plan.space.base.memory_limit_gib
    if 0 < already < plan.n_trials:
        lines.append(f"resume  the study holds {plural(already, 'finished trial')}; {plan.n_trials - already} to go")
        progress = front_progress_line(read)
        if progress:
            lines.append(progress)
        other_caps = _other_caps(read, limit_gib)
        if other_caps:
            lines.append(
                f"note    memory_limit_gib is {limit_gib:g} now; {other_caps}: their peaks stand, but what fit "
                "under their cap need not fit under this one, so the front, the picks and the exports compare the "
                "trials of this cap (the others stay in the report's tables)"
            )
    if plan.new_setup and already > 0 and not _other_caps(read, limit_gib):
        lines.append(
            f"setup   new settings for this study (--new-setup): its {plural(already, 'earlier finished trial')} "
            f"{'is' if already == 1 else 'are'} kept apart from the new ones in report and export; n_trials counts the "
            "whole study"
        )
    legacy = legacy_instability_warning(read)
    if legacy:
        lines.append(legacy)
    if already > 0 and front_axis(read) == "instability":
        lines.append(
            "note    this study was written before the stability margin: it ranks its trials by instability, "
            "and so will the new ones (they record their margin too); to rank by margin, start a new study "
            "(--study NAME)"
        )
    if already >= plan.n_trials:
        lines.append(
            f"the study already holds {plural(already, 'finished trial')} (n_trials={plan.n_trials}): nothing to run; "
            "raise --n-trials to measure more"
        )
        if plan.unapplied:
            lines.append(
                f"note    nothing ran, so these settings were not applied: {'; '.join(plan.unapplied)}; the front, "
                "report and export still compare the trials as measured; raise --n-trials to measure them"
            )
    return lines


def front_progress_line(study: StudySnapshot) -> str | None:
    """``front   the last 10 of 40 complete trials (#31 on) moved the front's hypervolume by 4%``: whether more trials
    of this space still find more (:attr:`sweeper.study.StudySnapshot.front_progress`); None with fewer than 6
    complete trials."""
    progress = study.front_progress
    if progress is None:
        return None
    line = (
        f"front   the last {progress.last} of {progress.complete} complete trials (#{progress.first_number} on) "
        f"moved the front's hypervolume by {progress.moved:.0%}"
    )
    if progress.moved < 0.005:
        line += ": they found nothing beyond the front of the trials before them"
    return line


def _other_caps(study: StudySnapshot, limit_gib: float) -> str | None:
    """``3 trials were measured under memory_limit_gib 1.7`` for the measured trials of a resumed study whose cap was
    not this run's, or None."""
    caps: Counter[float] = Counter()
    for t in study.trials:
        cap = t.config.memory_limit_gib if t.config is not None and not t.is_repeat else None
        if cap is not None and float(cap) != limit_gib:
            caps[float(cap)] += 1
    if not caps:
        return None
    n = sum(caps.values())
    shown = ", ".join(f"{c:g}" for c in sorted(caps))
    return f"{n} trial{'s were' if n != 1 else ' was'} measured under memory_limit_gib {shown}"


class SweepConsole(SweepCallback):
    """Prints a line per trial as it ends (:func:`sweeper.report._trial_text.format_trial_line`, with its device, retry
    and repeat), a ``start`` line per trial with several workers, and the sweep's notes, under a live display of what
    runs (:class:`sweeper.report.LiveProgress`: a bar and a line per worker slot on a terminal, a ``progress`` line
    every minute or so in a log); keeps the statuses of the trials this run measured (:attr:`statuses`).

    Args:
        plan: The sweep being run.
        write: Where a line goes (default: the live display's :meth:`~sweeper.report.LiveProgress.line`).
        stream: Where the live display writes (default ``sys.stdout``).
    """

    def __init__(self, plan: SweepPlan, write: Callable[[str], None] | None = None, stream: IO[str] | None = None):
        self.plan = plan
        self.live = LiveProgress(
            plan.n_trials, done=plan.finished_before, timeout_s=plan.timeout_s, slots=plan.workers, stream=stream
        )
        self.write = write or self.live.line
        self.statuses: list[TrialStatus] = []  # of the trials this run measured
        self.said: set[str] = set()  # the warnings written once a run (a worst-case step of zero tokens)

    def trial_progress(self, number: int, slot: int, progress: TrialProgress) -> None:
        """The live display's line of ``slot``: the trial's phase, step, loss, peak so far and time."""
        running = self.live.running.get(slot)
        if running is None or running.number != number:
            self.live.begin(slot, number)
        self.live.report(slot, progress)

    def close(self) -> None:
        """End the live display."""
        self.live.close()

    def trial_started(self, trial: StoredTrial, device: str | None) -> None:
        """With several workers, a ``start`` line: the trial's number, searched values and device."""
        if self.plan.workers > 1:
            shown = format_params({k: trial.params.get(k) for k in self.plan.space.search})
            self.write(f"start   #{trial.number:<3} {shown}" + (f"  [device {device}]" if device is not None else ""))

    def trial_finished(self, event: SweepEvent) -> None:
        """The trial's line: progress, values, status, peak, instability, time, and why it did not complete."""
        trial = event.trial
        params = {k: trial.params.get(k) for k in self.plan.space.search}
        line = _trial_line(trial.number, params, trial.result, event.finished, event.n_trials, repeat=trial.is_repeat)
        if not trial.is_repeat:
            self.statuses.append(trial.result.status)
        device = trial.user_attrs.get(TrialAttr.CUDA_VISIBLE_DEVICES)
        if self.plan.workers > 1 and device is not None:
            line += f"  [device {device}]"
        if trial.retry_of is not None:
            line += (  # an interrupted trial's rerun uses up no retry: say so, not "retry 1"
                f"  (retry {trial.retry_attempt} of #{trial.retry_of})"
                if trial.retry_attempt
                else f"  (rerun of #{trial.retry_of}, which was interrupted)"
            )
        if trial.retried:
            line += "  (its configuration runs again: max_retries)"
        self.write(line)
        if not trial.is_repeat and trial.config is not None:
            zero = worst_case_data_line(trial.result, trial.config.max_seq_length)  # a step over zero tokens
            if zero is not None and zero not in self.said:
                self.said.add(zero)
                self.write(zero)
        self.live.end_trial(trial.number, finished=event.finished)

    def note(self, text: str) -> None:
        """A ``note`` line."""
        self.write(f"note    {text}")

    @property
    def all_failed(self) -> bool:
        """This run measured trials and every one failed as a run (timeout, crash, error): the setup, not the
        hyperparameters."""
        return bool(self.statuses) and all(s in FAIL_STATUSES for s in self.statuses)


def sweep_summary(plan: SweepPlan, *, elapsed_s: float, out_of_time: bool) -> list[str]:
    """The lines after the last trial: why it stopped early, the Pareto front (with each pick's row), the counts by
    status, the picks, how far the memory predictions were from the measured peaks, the data NaN summary and the next
    commands.

    Args:
        plan: The sweep that ran.
        elapsed_s: Seconds this run took.
        out_of_time: The run's ``timeout_s`` was spent (not a reason to say it stopped early).
    """
    study, name = snapshot(plan.study), plan.name  # read once for the whole summary
    front = study.front
    early = _stopped_early_line(plan, study, out_of_time)
    lines = [*([early] if early else []), ""]
    current = study.current(study.trials)
    measured = sum(1 for t in current if not t.is_repeat)
    mine = {t.number for t in current}
    elsewhere = sum(1 for t in study.trials if t.status == TrialStatus.COMPLETE and t.number not in mine)
    # a storage of its own names the study after a '#': a journal or server may hold several (issue 55)
    ref = name if plan.is_default_storage else f"'{redact_url(plan.storage)}#{name}'"
    others = (
        f" ({elsewhere} complete trial{'s' if elsewhere != 1 else ''} of other settings: 'sweep report {ref}')"
        if elsewhere
        else ""
    )
    of_trials = plural(measured, "trial")
    lines.append(f"Pareto front (peak memory vs {front_axis(study)}), {len(front)} of {of_trials}{others}:")
    chosen, pick_block = picks_block(study, ref) if front else ({}, [])
    lines.append(
        format_front(front, study.objectives, chosen)
        if front
        else "  (no complete trial under these settings yet)"
        if elsewhere
        else "  (no complete trial yet)"
    )
    lines.append("")
    causes = study.nan_causes
    lines.append("trials: " + format_counts(study.status_counts, causes))
    lines += pick_block
    progress = front_progress_line(study)
    if progress:
        lines.append(progress)
    memory = memory_line(study)
    if memory:
        lines.append(memory)
    doctor = plan.space.doctor_command()
    if "data" in causes:
        blamed = {t.number: t.result.nan.samples for t in study.trials if t.number in causes["data"]}
        trials_dir = plan.trials_dir.as_posix()
        lines.append(format_data_nan_summary(causes, blamed, trials_dir) + f"; see '{doctor}'")
    # Export only what can be exported: with no complete trial the next step is what addresses the failures.
    after = (
        f"sweep report {ref}, sweep dashboard {ref}, sweep export {ref}"
        if front
        else f"sweep report {ref} (nothing to export: no trial completed"
        + (" under these settings" if elsewhere else "")
        + "; each trial's cause is there)"
        + "".join(f", {step}" for step in _next_steps(plan, causes, study))
    )
    lines.append(
        f"done in {elapsed_s:.0f} s; study in {redact_url(plan.storage)}; next: {after}"
        + (" (with your password in place of ***)" if "***" in ref else "")
    )
    return lines


def _stopped_early_line(plan: SweepPlan, study: StudySnapshot, out_of_time: bool) -> str | None:
    """Why the sweep stopped before ``n_trials``: the sampler kept proposing measured configurations, or the
    study's timeout passed (with the median trial's wall time); None when it did not stop early, or only this run's
    own time was spent."""
    finished = study.finished
    if finished < plan.n_trials and not out_of_time:
        return (
            f"stopped at {finished} of {plural(plan.n_trials, 'trial')}: the sampler proposed only configurations "
            f"already measured {plan.max_consecutive_repeats} times in a row; widen the search to measure more"
        )
    if finished < plan.n_trials and plan.timeout_s is not None:
        walls = sorted(w for t in study.measured if (w := t.result.provenance.wall_time_s) is not None)
        median = f"; a trial took a median {walls[len(walls) // 2]:.0f} s here" if walls else ""
        # the limit the user set: --timeout overrides the space's study.timeout
        which = "study.timeout" if plan.timeout_s == plan.space.study.timeout_s else "--timeout"
        return (
            f"stopped at {finished} of {plural(plan.n_trials, 'trial')}: the {which} ({_duration(plan.timeout_s)}) "
            f"passed{median}; run the same command to go on (the trials so far are kept), or raise {which}"
        )
    return None


def _next_steps(plan: SweepPlan, causes: Mapping[str, Sequence[int]], study: StudySnapshot | None = None) -> list[str]:
    """What addresses the failures of a sweep with no complete trial: the audit of the data the trials read for a
    data NaN, the memory model for out-of-memory trials, a timed-out or crashed trial's log; the data audit when
    nothing more specific applies."""
    statuses = {t.status for t in snapshot(study or plan.study).measured}
    steps = []
    if "data" in causes:
        steps.append(plan.space.doctor_command())
    if statuses & {TrialStatus.OOM, TrialStatus.PREDICTED_OOM, TrialStatus.DOMINATED_OOM}:
        device = "" if cuda_visible() else " --device cpu"  # the model of the trials this machine ran
        steps.append(f"{plan.space.command('estimate')}{device} (what fits memory_limit_gib)")
    if statuses & {TrialStatus.TIMEOUT, TrialStatus.CRASH, TrialStatus.ERROR}:
        steps.append(f"each failed trial's {plan.trials_dir.as_posix()}/N/worker.log")
    return steps or [plan.space.doctor_command()]


def all_failed_line(plan: SweepPlan, statuses: list[TrialStatus]) -> str:
    """The error line when every trial this run started failed as a run: the machine or the setup."""
    return (
        f"sweep: every trial this run started failed ({', '.join(sorted(set(statuses)))}): the machine or the "
        f"setup, not the hyperparameters; see the reasons above and {plan.trials_dir}/N/worker.log"
    )


def memory_line(study: StudySnapshot) -> str | None:
    """How far the preflight's predictions were from the measured peaks, before and after the study's correction
    (:attr:`sweeper.study.StudySnapshot.prediction_errors`), and the correction now stored; None without a measured
    peak."""
    rows = snapshot(study).prediction_errors
    raw = median_abs(r.error for r in rows)
    if raw is None:
        return None
    line = f"memory  predicted vs measured peak: median error {100 * raw:.0f}% (memory model)"
    corrected = [r.corrected_error for r in rows if r.corrected_error is not None]
    error = median_abs(corrected)
    if error is not None:
        plural = "s" if len(corrected) != 1 else ""
        line += f", {100 * error:.0f}% corrected ({len(corrected)} trial{plural} predicted with the correction)"
    calibration = stored_calibration(study)
    if calibration is not None:
        shown = [
            f"{g} {calibration.lines[g][0]:+.2f} + {calibration.lines[g][1]:.2f} x predicted"
            if g in calibration.lines
            else f"{g} x{r:.2f}"
            for g, r in sorted(calibration.ratios.items())
        ]
        line += "; correction now " + ", ".join(shown)
    return line


def _duration(seconds: float) -> str:
    """``45 s``, ``25 min`` or ``8.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"
