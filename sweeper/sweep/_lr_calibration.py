"""``sweep calibrate``: the study's own factor from a short trial's ``lr_ceiling`` to ``predicted_max_lr``, measured on
the study's model and data at its long horizon.

The built-in factor (:data:`sweeper.stability._margin.LONG_RUN_FACTOR`) was measured on SmolLM2-135M; no published
source says whether a range test's ceiling relates to the long-run edge the same way on another model. This module
bisects, for a few of the study's complete trials, the constant learning rate at which a run of the study's long horizon
(``confirm_steps``) fails (``nan`` or ``diverged``): the largest multiple of the trial's rate that held and the
smallest that failed, within ``resolution`` of each other. Each trial's factor is its edge (the geometric mean of the
two) over its ``lr_ceiling``; the study's is their geometric mean, with their geometric SD as its spread.

Where it is kept: each run as a study user attribute ``lr_calibration_run:<trial>:<multiple>`` (status, fail step,
steps) when it ends, so a stopped calibration loses at most the run it was in and the same command goes on; the
factor as ``lr_calibration`` (:data:`sweeper.storage.StudyAttr.LR_CALIBRATION`), which every reader of the study
then uses for ``predicted_max_lr`` (:func:`sweeper.study._stored.with_intervals`).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from sweeper.errors import StudyError
from sweeper.stability import DEFAULT_LR_CALIBRATION, LrCalibration, refit_mu
from sweeper.storage import StudyAttr, trial_dir
from sweeper.study import StoredTrial, StudyLike, by_knee_distance, snapshot
from sweeper.sweep._confirm import DEFAULT_HORIZON_FACTOR, horizon, long_config
from sweeper.trial import Measures, TrialProgress, TrialResult, TrialStatus, run_trial

#: Default bracket: the edge is known to within this factor (the largest multiple that held and the smallest that
#: failed are at most this far apart).
DEFAULT_RESOLUTION = 1.5

#: Multiples of a trial's learning rate tried at most: beyond them the edge is reported as not found.
MULTIPLE_RANGE = (1 / 256, 4096.0)

FAILED = (TrialStatus.NAN, TrialStatus.DIVERGED)


@dataclass(frozen=True, kw_only=True)
class EdgeRun:
    """One constant-rate run of a calibration.

    Attributes:
        trial: The study trial whose configuration ran.
        multiple: Its learning rate over the trial's.
        steps: The run's horizon (optimizer steps).
        status: How it ended: ``complete`` (held), ``nan`` or ``diverged`` (failed); other statuses say nothing
            about the edge and are run again.
        fail_step: The step it failed at, or None.
    """

    trial: int
    multiple: float
    steps: int
    status: str
    fail_step: int | None

    @property
    def failed(self) -> bool:
        """It failed at this rate (``nan`` or ``diverged``)."""
        return self.status in FAILED

    @property
    def is_outcome(self) -> bool:
        """It says something about the edge: it held or failed (not a crash, timeout, error or OOM)."""
        return self.status == TrialStatus.COMPLETE or self.failed


@dataclass(frozen=True, kw_only=True)
class Edge:
    """A trial's bisected long-run edge.

    Attributes:
        trial: The trial number.
        learning_rate: The trial's own learning rate.
        held: The largest multiple of it that held the horizon.
        failed: The smallest multiple that failed.
        lr_ceiling: The trial's stress-phase ceiling.
        steps: The horizon the runs bracketing it were of (None: not recorded).
    """

    trial: int
    learning_rate: float
    held: float
    failed: float
    lr_ceiling: float
    steps: int | None = None

    @property
    def edge_lr(self) -> float:
        """The edge learning rate: the geometric mean of the bracket's ends, times the trial's rate."""
        return self.learning_rate * math.sqrt(self.held * self.failed)

    @property
    def factor(self) -> float:
        """``edge_lr / lr_ceiling``: this trial's calibration factor."""
        return self.edge_lr / self.lr_ceiling

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as stored in ``lr_calibration``'s ``measured``."""
        return {
            "trial": self.trial,
            "held": self.held,
            "failed": self.failed,
            "edge_lr": self.edge_lr,
            "lr_ceiling": self.lr_ceiling,
            "factor": self.factor,
            "steps": self.steps,
        }


def stored_runs(study: optuna.Study) -> dict[tuple[int, float], EdgeRun]:
    """Every calibration run the study holds, by (trial, multiple) (its study attributes, read once)."""
    out = {}
    for key, raw in study.user_attrs.items():
        if not key.startswith(StudyAttr.LR_CALIBRATION_RUN) or not isinstance(raw, dict):
            continue
        try:
            run = EdgeRun(
                trial=int(raw["trial"]),
                multiple=float(raw["multiple"]),
                steps=int(raw["steps"]),
                status=str(raw["status"]),
                fail_step=raw.get("fail_step"),
            )
        except (KeyError, TypeError, ValueError):
            continue
        out[(run.trial, run.multiple)] = run
    return out


def _key(trial: int, multiple: float) -> str:
    return f"{StudyAttr.LR_CALIBRATION_RUN}{trial}:{multiple:.6g}"


def calibration_from(edges: Sequence[Edge], resolution: float) -> LrCalibration:
    """The study's factor from its ``edges``: the geometric mean of their factors; its spread is their geometric SD,
    at least the bracket's own (``sqrt(resolution)``), and at least the built-in factor's
    (:data:`sweeper.stability._margin.LONG_RUN_FACTOR_GSD`) while fewer than 3 edges say otherwise.

    Raises:
        ValueError: ``edges`` is empty.
    """
    if not edges:
        raise ValueError("no edge measured")
    logs = [math.log(e.factor) for e in edges]
    factor = math.exp(statistics.fmean(logs))
    gsd = math.exp(statistics.stdev(logs)) if len(logs) >= 2 else 1.0
    gsd = max(gsd, math.sqrt(resolution))
    if len(edges) < 3:
        gsd = max(gsd, DEFAULT_LR_CALIBRATION.gsd)
    n = len(edges)
    # the chance model's intercept, what varies by model (issue 66), refitted on the same edges where their horizon
    # is known: each edge is where a run of its length fails about half the time
    mu = mu_se = None
    if all(e.steps for e in edges):
        mu, mu_se = refit_mu([(e.lr_ceiling / e.learning_rate, e.edge_lr / e.learning_rate, e.steps or 0)
                              for e in edges])  # fmt: skip
    fitted = LrCalibration(factor=factor, gsd=gsd, edges=n, source="", calibrated=True, mu=mu, mu_se=mu_se)
    source = f"calibrated on this study's model ({n} edge{'s' if n != 1 else ''}, spread x{fitted.spread:.2g})"
    return replace(fitted, source=source)


def calibration_trials(study: StudyLike, numbers: Sequence[int] | None) -> list[StoredTrial]:
    """The trials to bisect, in order: ``numbers`` (a repeat stands for its original), else the front's trials (least
    memory first), then the other measured complete trials of the current setup, the nearest the front's knee first;
    only COMPLETE trials whose stress phase found a ceiling (a capped one has no edge in reach of its ramp).

    Raises:
        StudyError: A number is not a trial of the study, did not complete, or has no ceiling; or no trial has one.
    """
    snap = snapshot(study)
    name = snap.name
    if numbers is None:
        front = {t.number for t in snap.front}
        rest = by_knee_distance(
            [t for t in snap.current(snap.measured) if t.values is not None and t.number not in front],
            snap.objectives,
        )
        chosen = [
            t
            for t in [*snap.front, *rest]
            if t.status == TrialStatus.COMPLETE and t.config is not None and t.result.stress.lr_ceiling is not None
        ]
        if not chosen:
            raise StudyError(
                f"{name}: calibrate: no complete trial has a measured lr_ceiling (every stress phase reached its cap "
                "or did not run); run trials at higher learning rates with 'sweep run', or name trials with --trials"
            )
        return chosen
    out = []
    for number in numbers:
        t = snap.by_number.get(number)
        if t is None:
            raise StudyError(f"{name}: --trials: no trial {number} in this study; see 'sweep report {name}'")
        if t.repeat_of is not None:
            t = snap.by_number[t.repeat_of]
        if t.status != TrialStatus.COMPLETE or t.config is None or t.result.stress.lr_ceiling is None:
            raise StudyError(
                f"{name}: --trials: trial {number} has no measured lr_ceiling ({t.status_name}); choose complete "
                "trials whose stress phase diverged (see the margin column of 'sweep report')"
            )
        out.append(t)
    return out


def bracket(runs: dict[float, EdgeRun]) -> tuple[float | None, float | None]:
    """(largest multiple that held below every failure, smallest that failed) among ``runs`` of one trial."""
    failed = [m for m, r in runs.items() if r.failed]
    lowest_fail = min(failed) if failed else None
    held = [m for m, r in runs.items() if r.status == TrialStatus.COMPLETE and (lowest_fail is None or m < lowest_fail)]
    return (max(held) if held else None), lowest_fail


def next_multiple(trial: StoredTrial, runs: dict[float, EdgeRun], resolution: float) -> float | None:
    """The next multiple to run for ``trial``, or None when its edge is bracketed within ``resolution`` (or out of
    :data:`MULTIPLE_RANGE`). It starts at the uncalibrated ``predicted_max_lr``, steps by 4x until the outcome flips,
    then bisects in log space."""
    held, failed = bracket(runs)
    if held is None and failed is None:
        assert trial.config is not None and trial.result.stress.lr_ceiling is not None
        start = trial.result.stress.lr_ceiling * DEFAULT_LR_CALIBRATION.factor / trial.config.learning_rate
        return float(f"{max(MULTIPLE_RANGE[0], min(MULTIPLE_RANGE[1], start)):.4g}")
    if failed is None:
        assert held is not None
        nxt = held * 4
    elif held is None:
        nxt = failed / 4
    elif failed / held <= resolution * (1 + 1e-9):
        return None
    else:
        nxt = math.sqrt(held * failed)
    if not MULTIPLE_RANGE[0] <= nxt <= MULTIPLE_RANGE[1]:
        return None
    return float(f"{nxt:.4g}")


class CalibrationCallback:
    """What :func:`calibrate_study` tells as it runs, as :class:`sweeper.sweep.SweepCallback` does for a sweep:
    subclass it and override what you need (each method does nothing here)."""

    def run_started(self, trial: StoredTrial, multiple: float, steps: int) -> None:
        """A constant-rate run of ``trial`` at ``multiple`` times its learning rate, ``steps`` steps, is starting."""

    def run_progress(self, trial: StoredTrial, progress: TrialProgress) -> None:
        """The run sent a progress report (:meth:`sweeper.trial.TrialProcess.run`)."""

    def run_finished(self, trial: StoredTrial, run: EdgeRun) -> None:
        """The run ended and is stored; a run that is not an outcome (:attr:`EdgeRun.is_outcome`) ends the trial's
        bisection."""


def _check_steps(study: optuna.Study, trials: Sequence[StoredTrial], steps: int | None) -> None:
    """Refuse a calibration run no longer than a chosen trial: it measures no long-run edge (before anything runs).

    Raises:
        StudyError: The run is not longer than a trial's ``max_steps``.
    """
    snap = snapshot(study)
    for t in trials:
        assert t.config is not None
        n = steps if steps is not None else (snap.confirm_steps or horizon(t, None))
        if n <= t.config.max_steps:
            raise StudyError(
                f"{study.study_name}: --steps: a {n}-step calibration run is not longer than trial {t.number}'s "
                f"{t.config.max_steps} steps, so it would calibrate nothing (the factor is from a short trial to a "
                f"long run); give --steps above {t.config.max_steps}, e.g. --steps "
                f"{DEFAULT_HORIZON_FACTOR * t.config.max_steps}"
            )


def calibrate_study(
    study: optuna.Study,
    *,
    numbers: Sequence[int] | None,
    steps: int | None,
    model_path: str,
    max_runs: int,
    max_hours: float | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    callback: CalibrationCallback | None = None,
) -> tuple[LrCalibration | None, list[Edge]]:
    """Bisect the long-run edge of each chosen trial (:func:`calibration_trials`) in turn, within ``max_runs`` runs
    (and ``max_hours``), each a constant-rate run of ``steps`` (default: the study's ``confirm_steps``, else
    :func:`sweeper.sweep._confirm.horizon`) through the sweep's trial process; store every run as it ends, then the
    factor (:func:`calibration_from`) over the edges bracketed so far.

    Returns:
        The stored calibration (None while no edge is bracketed) and the edges it rests on.

    Raises:
        StudyError: Bad ``numbers`` (see :func:`calibration_trials`), or a run no longer than a chosen trial's
            ``max_steps`` (nothing runs then, nothing is stored).
        KeyboardInterrupt: After killing the running trial process; the runs before it are kept.
    """
    trials = calibration_trials(study, numbers)
    _check_steps(study, trials, steps)
    snap = snapshot(study)
    tell = callback or CalibrationCallback()
    done = stored_runs(study)
    deadline = time.monotonic() + max_hours * 3600 if max_hours else math.inf
    spent = 0
    for t in trials:
        assert t.config is not None
        n = steps if steps is not None else (snap.confirm_steps or horizon(t, None))
        mine = {m: r for (num, m), r in done.items() if num == t.number and r.steps == n and r.is_outcome}
        while spent < max_runs and time.monotonic() < deadline:
            multiple = next_multiple(t, mine, resolution)
            if multiple is None:
                break
            run = _run_at(study, t, multiple, n, model_path, tell)
            spent += 1
            if not run.is_outcome:  # a crash, timeout or OOM says nothing about the edge: stop, keep the rest
                break
            mine[multiple] = run
    edges = measured_edges(study, resolution, steps)
    if not edges:
        return None, []
    calibration = calibration_from(edges, resolution)
    study.set_user_attr(
        StudyAttr.LR_CALIBRATION,
        {
            "factor": calibration.factor,
            "gsd": calibration.gsd,
            "edges": calibration.edges,
            "source": calibration.source,
            "mu": calibration.mu,
            "mu_se": calibration.mu_se,
            "resolution": resolution,
            "measured": [e.to_dict() for e in edges],
        },
    )
    return calibration, edges


def _run_at(
    study: optuna.Study, t: StoredTrial, multiple: float, n: int, model_path: str, tell: CalibrationCallback
) -> EdgeRun:
    """One constant-rate run of ``n`` steps of trial ``t``'s configuration at ``multiple`` times its learning rate,
    through the sweep's trial process, in ``calibrate-<n>-x<multiple>`` of its folder; stored in the study as it ends
    and told to ``tell``."""
    assert t.config is not None
    tell.run_started(t, multiple, n)
    config = replace(long_config(t.config, n), learning_rate=t.config.learning_rate * multiple)
    folder = trial_dir(study.study_name, t.number) / f"calibrate-{n}-x{multiple:g}"
    result: TrialResult = run_trial(
        config,
        folder,
        model_path=model_path,
        measures=Measures(stress=None),
        on_progress=functools.partial(tell.run_progress, t),
    )
    run = EdgeRun(trial=t.number, multiple=multiple, steps=n, status=str(result.status), fail_step=result.fail_step)
    study.set_user_attr(
        _key(t.number, multiple),
        {"trial": t.number, "multiple": multiple, "steps": n, "status": run.status, "fail_step": run.fail_step},
    )
    tell.run_finished(t, run)
    return run


def measured_edges(study: optuna.Study, resolution: float, steps: int | None = None) -> list[Edge]:
    """The edges the study's stored runs bracket within ``resolution`` (at ``steps``, else each trial's horizon)."""
    snap = snapshot(study)
    runs = stored_runs(study)
    out = []
    for number in sorted({num for num, _ in runs}):
        t = snap.by_number.get(number)
        if t is None or t.config is None or t.result.stress.lr_ceiling is None:
            continue
        n = steps if steps is not None else (snap.confirm_steps or horizon(t, None))
        mine = {m: r for (num, m), r in runs.items() if num == number and r.steps == n and r.is_outcome}
        held, failed = bracket(mine)
        if held is not None and failed is not None and failed / held <= resolution * (1 + 1e-9):
            out.append(
                Edge(
                    trial=number,
                    learning_rate=t.config.learning_rate,
                    held=held,
                    failed=failed,
                    lr_ceiling=t.result.stress.lr_ceiling,
                    steps=n,
                )
            )
    return out
