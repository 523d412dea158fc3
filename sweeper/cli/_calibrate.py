"""``sweep calibrate STUDY``: measure the study's own ``predicted_max_lr`` factor on its model and data."""

from __future__ import annotations

import argparse

from sweeper.cli._common import _check_trial_environment, _print, _publish
from sweeper.errors import SpaceError


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``sweep calibrate STUDY [--trials 3,7] [--runs N] [--hours H] [--steps N] [--resolution F]``: bisect the
    long-run edge of a few front trials within the budget, store the study's factor, and say what it rests on."""
    import optuna

    from sweeper.cli._confirm import _check_setup, _numbers, model_path_for
    from sweeper.cli._long_run_console import CalibrateConsole
    from sweeper.report import predicted_text
    from sweeper.storage import check_study_owner
    from sweeper.study import load_existing_study, snapshot
    from sweeper.sweep import calibrate_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.steps is not None and not 1 <= args.steps <= 10**7:
        raise SpaceError(f"--steps: {args.steps} is not a number of steps; give 1 to 10000000, e.g. --steps 300")
    if not 1 <= args.runs <= 10_000:
        raise SpaceError(f"--runs: {args.runs} is not a number of runs; give 1 to 10000, e.g. --runs 12")
    if args.hours is not None and not args.hours > 0:
        raise SpaceError(f"--hours: {args.hours} is not a duration; give hours above 0, e.g. --hours 4")
    if not args.resolution > 1:
        raise SpaceError(f"--resolution: {args.resolution} must be above 1 (the edge's bracket), e.g. 1.5")
    _check_trial_environment()  # a bad SWEEPER_TRIAL_START or SWEEPER_WARM is one line, never ignored
    study, url = load_existing_study(args.study)
    check_study_owner(study, url)  # calibrate writes into studies/<name>/: not into another study's folder
    read = snapshot(study)
    numbers = _numbers(args.trials) if args.trials is not None else None  # an empty --trials is refused
    first = next((t for t in read.front if t.config is not None), None)
    if first is not None:
        _check_setup(study, first.config)
    console = CalibrateConsole(args.runs)
    try:
        calibration, edges = calibrate_study(
            study,
            numbers=numbers,
            steps=args.steps if args.steps is not None else read.confirm_steps,
            model_path=model_path_for(read, first) if first is not None else "",
            max_runs=args.runs,
            max_hours=args.hours,
            resolution=args.resolution,
            callback=console,
        )
    finally:
        console.close()
    if calibration is None:
        _print(
            f"calibrate: no edge bracketed yet within {args.runs} runs; run the same command again to go on (the "
            "runs so far are kept)"
        )
        return 0
    for e in edges:
        _print(
            f"edge    #{e.trial:<3} held {e.held:g}x, failed {e.failed:g}x its learning rate: edge {e.edge_lr:.3g}, "
            f"{e.factor:.3g} x its lr_ceiling {e.lr_ceiling:.3g}"
        )
    _print(
        f"factor  {calibration.factor:.3g} (geometric SD {calibration.gsd:.2f}; a prediction's 95% interval is x/"
        f"{calibration.spread:.2g}): {calibration.source}; every predicted_max_lr of {study.study_name} now uses it"
    )
    after = snapshot(study)
    for t in after.front[:3]:
        _print(f"        #{t.number:<3} predicted_max_lr {predicted_text(t.result.stress)}")
    _publish(study)
    return 0
