"""``sweep confirm STUDY``: run the front's chosen configurations again at a long horizon and record the outcome."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sweeper.cli._common import _check_trial_environment, _print, _publish
from sweeper.errors import SpaceError
from sweeper.space import MAX_STEPS

if TYPE_CHECKING:
    import optuna


def run_confirmations(
    study: optuna.Study, numbers: list[int], steps: int | None, as_exported: bool = False
) -> tuple[int, int]:
    """Confirm ``numbers`` (:func:`sweeper.sweep.confirm_trials`), printing a line as each starts and ends
    (:class:`sweeper.cli._long_run_console.ConfirmConsole`); with ``as_exported``, the configurations ``sweep export``
    writes (their ``gradient_accumulation_steps``).

    Returns:
        How many failed their confirmation, and how many could not run (a failure of the attempt: nothing recorded).
    """
    from sweeper.cli._long_run_console import ConfirmConsole
    from sweeper.study import snapshot
    from sweeper.sweep import confirm_trials, long_run_model_path

    if not numbers:
        return 0, 0
    read = snapshot(study)
    first = read.by_number.get(numbers[0])
    if first is not None and first.repeat_of is not None:
        first = read.by_number.get(first.repeat_of)
    # A number that is not a complete trial is refused by confirm_trials before anything runs.
    model_path = long_run_model_path(read, first) if first is not None and first.config is not None else ""
    console = ConfirmConsole(len(set(numbers)), read.searched, as_exported)
    try:
        confirm_trials(study, numbers, steps=steps, model_path=model_path, callback=console, as_exported=as_exported)
    finally:
        console.close()
    return console.failed, console.not_run


def _numbers(text: str) -> list[int]:
    try:
        numbers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        numbers = []
    if not numbers or any(n < 0 for n in numbers):
        raise SpaceError(f"--trials: {text!r} is not a list of trial numbers; write e.g. --trials 3,7")
    return numbers


def cmd_confirm(args: argparse.Namespace) -> int:
    """``sweep confirm STUDY [--steps N] [--trials 3,7 | --front | --pick safe] [--as-exported]``."""
    from sweeper.storage import check_study_owner
    from sweeper.study import load_existing_study, snapshot
    from sweeper.sweep import trials_to_confirm

    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise SpaceError(f"--steps: {args.steps} is not a number of steps; give 1 to {MAX_STEPS}, e.g. --steps 300")
    _check_trial_environment()  # a bad SWEEPER_TRIAL_START or SWEEPER_WARM is one line, never ignored
    study, url = load_existing_study(args.study)
    check_study_owner(study, url)  # confirm writes into studies/<name>/: not into another study's folder
    read = snapshot(study)
    # an empty --trials (an unset variable in a script) is refused, not the default
    given = _numbers(args.trials) if args.trials is not None else None
    numbers = trials_to_confirm(read, numbers=given, front=args.front, pick=args.pick)
    steps = args.steps if args.steps is not None else read.confirm_steps
    failed, not_run = run_confirmations(study, numbers, steps, as_exported=args.as_exported)
    _publish(study)  # the dashboard's front figure and notes show the confirmations
    done = snapshot(study).confirmations
    ok = sum(1 for n in numbers if n in done and done[n].passed)
    _print(
        f"confirmed {ok} of {len(set(numbers))}"
        + (f"; {failed} failed: 'sweep export' refuses them" if failed else "")
        + (f"; {not_run} could not run (see above): run the same command once it is fixed" if not_run else "")
        + f"; see 'sweep report {study.study_name}'"
    )
    return 2 if not_run else 0
