"""``sweep calibrate STUDY``: measure the study's own ``predicted_max_lr`` factor on its model and data."""

from __future__ import annotations

import argparse

from sweeper.cli._common import _check_trial_environment, _print, _publish
from sweeper.errors import SpaceError
from sweeper.space import MAX_STEPS


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``sweep calibrate STUDY [--trials 3,7] [--runs N] [--hours H] [--steps N] [--resolution F]``: bisect the
    long-run edge of a few front trials within the budget, store the study's factor, and say what it rests on."""

    from sweeper.cli._confirm import _numbers
    from sweeper.cli._long_run_console import CalibrateConsole, calibration_lines
    from sweeper.storage import check_study_owner
    from sweeper.study import load_existing_study, snapshot
    from sweeper.sweep import calibrate_study, long_run_model_path

    _check_options(args)
    _check_trial_environment()  # a bad SWEEPER_TRIAL_START or SWEEPER_WARM is one line, never ignored
    study, url = load_existing_study(args.study)
    check_study_owner(study, url)  # calibrate writes into studies/<name>/: not into another study's folder
    read = snapshot(study)
    numbers = _numbers(args.trials) if args.trials is not None else None  # an empty --trials is refused
    first = next((t for t in read.front if t.config is not None), None)
    model_path = long_run_model_path(read, first) if first is not None else ""
    console = CalibrateConsole(args.runs)
    try:
        calibration, edges = calibrate_study(
            study,
            numbers=numbers,
            steps=args.steps if args.steps is not None else read.confirm_steps,
            model_path=model_path,
            max_runs=args.runs,
            max_hours=args.hours,
            resolution=args.resolution,
            callback=console,
        )
    finally:
        console.close()
    for line in calibration_lines(snapshot(study), calibration, edges, args.runs):
        _print(line)
    if calibration is not None:
        _publish(study)
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """Refuse an option out of its range: one line naming it and an example.

    Raises:
        SpaceError: ``--steps``, ``--runs``, ``--hours`` or ``--resolution`` out of range.
    """
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise SpaceError(f"--steps: {args.steps} is not a number of steps; give 1 to {MAX_STEPS}, e.g. --steps 300")
    if not 1 <= args.runs <= 10_000:
        raise SpaceError(f"--runs: {args.runs} is not a number of runs; give 1 to 10000, e.g. --runs 12")
    if args.hours is not None and not args.hours > 0:
        raise SpaceError(f"--hours: {args.hours} is not a duration; give hours above 0, e.g. --hours 4")
    if not args.resolution > 1:
        raise SpaceError(f"--resolution: {args.resolution} must be above 1 (the edge's bracket), e.g. 1.5")
