"""``sweep confirm STUDY``: run the front's chosen configurations again at a long horizon and record the outcome."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sweeper.cli._common import _check_trial_environment, _print, _publish
from sweeper.errors import SpaceError


def model_path_for(study: Any, trial: Any) -> str:
    """The local checkpoint a confirmation loads: the one the sweep's trials loaded (``study``, a
    :class:`sweeper.study.StudySnapshot`) when it is still there, else the trial's model resolved again (the built-in
    model is converted once and cached)."""
    from sweeper.model import resolve_model

    local = study.model_path
    if local and Path(local).exists():
        return str(local)
    return resolve_model(trial.config.model)


def run_confirmations(study: Any, numbers: list[int], steps: int | None, as_exported: bool = False) -> tuple[int, int]:
    """Confirm ``numbers`` (:func:`sweeper.study.confirm_trials`), printing a line as each starts and ends; with
    ``as_exported``, the configurations ``sweep export`` writes (their ``gradient_accumulation_steps``).

    Returns:
        How many failed their confirmation, and how many could not run (a failure of the attempt: nothing recorded).
    """
    from sweeper.report import LiveProgress, format_params
    from sweeper.study import snapshot
    from sweeper.sweep import confirm_trials

    if not numbers:
        return 0, 0
    read = snapshot(study)
    trials = read.by_number
    first = trials.get(numbers[0])
    if first is not None and first.repeat_of is not None:
        first = trials.get(first.repeat_of)
    # A number that is not a complete trial is refused by confirm_trials before anything runs.
    model_path = model_path_for(read, first) if first is not None and first.config is not None else ""
    if first is not None and first.config is not None:
        _check_setup(study, first.config)
    failed = not_run = 0
    live = LiveProgress(len(set(numbers)), label="confirmations")
    say = live.line  # the lines go above the live display

    def shown(t: Any) -> str:
        keys = list(read.searched) or ["r", "lora_alpha_ratio", "bnb_4bit_compute_dtype"]
        return format_params({k: t.params.get(k) for k in keys if k in t.params})

    def on_start(t: Any, n: int) -> None:
        own, exported = t.config.effective_batch_size, t.config.as_exported().effective_batch_size
        if as_exported:
            batch = f"effective batch {exported}, as exported (the trial ran {own})"
        elif exported != own:
            batch = f"effective batch {own}, the trial's; the export trains at {exported}: --as-exported runs that"
        else:
            batch = f"effective batch {own}, as exported"
        say(f"confirm #{t.number:<3} {shown(t)}: {n} steps (the trial ran {t.config.max_steps}), {batch}")
        live.begin(0, t.number, "confirm")

    def on_result(t: Any, done: Any) -> None:
        nonlocal failed, not_run
        live.end(0)
        if not done.is_outcome:
            not_run += 1
            earlier = t.confirmation
            say(
                f"        #{t.number:<3} could not run its confirmation ({done.status} at step {done.fail_step}: "
                f"{done.reason}): a failure of the attempt, not of the configuration, so it is not recorded as its "
                "outcome"
                + (f" (its {earlier.steps}-step confirmation stands)" if earlier is not None else "")
                + "; fix it and run the same command"
            )
            return
        failed += 0 if done.passed else 1
        say(_outcome_line(t, done))

    def on_skip(t: Any, done: Any) -> None:
        nonlocal failed
        failed += 0 if done.passed else 1
        live.end_trial(t.number)
        say(f"confirm #{t.number:<3} already confirmed at {done.steps} steps: {done.label}")

    try:
        confirm_trials(
            study,
            numbers,
            steps=steps,
            model_path=model_path,
            on_start=on_start,
            on_result=on_result,
            on_skip=on_skip,
            on_progress=lambda t, progress: live.report(0, progress),
            as_exported=as_exported,
        )
    finally:
        live.close()
    return failed, not_run


def _outcome_line(t: Any, done: Any) -> str:
    """The line of a confirmation that ended with an outcome: confirmed or FAILED, with what the trial's margin had
    predicted."""
    from sweeper.report import format_instability, margin_text, predicted_text

    peak = "-" if done.peak_memory_gib is None else f"{done.peak_memory_gib:.2f} GiB"
    margin = margin_text(t.result.stress)
    said = ""
    if done.predicted_to_hold is not None:
        said = (
            f"; its margin {margin} said it {'holds' if done.predicted_to_hold else 'fails'} "
            f"(predicted_max_lr {done.predicted_max_lr:.3g}): "
            + ("as predicted" if done.margin_held else "NOT as predicted")
        )
    elif done.left_open:
        said = (
            f"; its margin {margin} left it open: the learning rate lies inside predicted_max_lr's interval "
            f"({predicted_text(t.result.stress)}), where either outcome is within the noise"
        )
    if done.passed:
        return (
            f"        #{t.number:<3} confirmed: {done.steps} steps complete, instability "
            f"{format_instability(done.instability)} (short {format_instability(t.result.constant.instability)}), "
            f"peak {peak} "
            f"({done.wall_time_s or 0:.0f} s){said}"
        )
    return (
        f"        #{t.number:<3} FAILED its confirmation: {done.status} at step {done.fail_step} of "
        f"{done.steps}: {done.reason} ({done.wall_time_s or 0:.0f} s){said}"
    )


def _check_setup(study: Any, config: Any) -> None:
    """What would fail every confirmation before its first step, found before any runs (one line, exit 2): the
    study's folder cannot be written, or the data cannot be read (a file moved away, or a relative path read from
    another folder).

    Raises:
        StudyError, DataError: Said in one line, naming the folder or the file and the fix.
    """
    from sweeper.data import load_samples

    load_samples(config.dataset)  # the study's folder was checked writable with its owner (check_study_owner)


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
    import optuna

    from sweeper.study import check_study_owner, load_existing_study, snapshot
    from sweeper.study.picks import choose
    from sweeper.sweep import candidates

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.steps is not None and not 1 <= args.steps <= 10**7:
        raise SpaceError(f"--steps: {args.steps} is not a number of steps; give 1 to 10000000, e.g. --steps 300")
    _check_trial_environment()  # a bad SWEEPER_TRIAL_START or SWEEPER_WARM is one line, never ignored
    study, url = load_existing_study(args.study)
    check_study_owner(study, url)  # confirm writes into studies/<name>/: not into another study's folder
    read = snapshot(study)
    if args.trials is not None:  # an empty --trials (an unset variable in a script) is refused, not the default
        numbers = _numbers(args.trials)
    elif args.front:
        numbers = [t.number for t in candidates(read)]
    else:
        ranked = candidates(read)
        if not ranked:
            raise SpaceError(
                f"{study.study_name}: --pick: the study has no complete trial to confirm; run more "
                "trials with 'sweep run'"
            )
        # what to confirm next: the pick among every trial of the front, not only the confirmed ones
        numbers = [
            ranked[0].number if args.pick == "safe" else choose(read, args.pick, prefer_confirmed=False).chosen().number
        ]
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
