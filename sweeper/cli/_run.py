"""``sweep run SPACE.yaml``: create or resume the study and run trials until ``n_trials`` or the timeout."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from sweeper.cli._common import (
    _check_trial_environment,
    _devices,
    _load,
    _prepare,
    _print,
    _profile,
    _publish,
)
from sweeper.cli._setup_text import _describe_setup, _dropped_rows_line
from sweeper.errors import SpaceError
from sweeper.space import SearchSpace, parse_duration_s
from sweeper.storage import StudyAttr

if TYPE_CHECKING:
    from sweeper.audit import DataProfile
    from sweeper.data import FileLengths
    from sweeper.devices import Card
    from sweeper.sweep import SweepPlan


def _data_warnings(space: SearchSpace, profile: DataProfile) -> list[str]:
    """Before the first trial: the data audit at the searched ``max_seq_length`` values (``profile.report``), as
    warning lines (:func:`sweeper.report.format_data_warnings`), so that a data fault is never read as a
    hyperparameter result; with the whole file's rows (``profile.file``), which set each configuration's worst step:
    the file's, which the exports train, not only the ``max_samples`` the trials sample. The data was checked
    (:func:`sweeper.sweep.check_data`, with :func:`_dropped_rows_line`)."""
    from sweeper.audit import nan_risks
    from sweeper.report import format_data_warnings, format_file_rows, format_same_rows, format_untrained_rows

    lengths = space.values_of("max_seq_length")
    report, tokenized, file = profile.report, profile.tokenized, profile.file
    assert report is not None  # profiled with the audit
    accumulation = space.values_of("gradient_accumulation_steps")
    risks = nan_risks(
        report,
        tokenized,
        space.values_of("per_device_train_batch_size"),
        accumulation,
        max(space.values_of("max_steps")),
    )
    lines = format_data_warnings(
        report, risks, several_accumulations=len(accumulation) > 1, doctor=space.doctor_command()
    )
    if file.cut:  # the audit above is of the trials' sampled rows; the whole file's NaN rows follow
        lines = [line.replace("data    audited at", f"data    the trials' {file.sampled} sampled rows audited at", 1)
                 for line in lines]  # fmt: skip
    same = format_same_rows(lengths, file.longest or None, space.values_of("packing"))
    # the whole file's rows that make a NaN step, which the exports train and the sampled audit cannot see
    untrained = format_untrained_rows(file, lengths, space.doctor_command())
    return lines + untrained + [f"data    {line}" for line in (format_file_rows(file), same) if line]


def cmd_run(args: argparse.Namespace) -> int:
    """``sweep run SPACE.yaml``: create or resume the study and run trials until n_trials or the timeout."""

    from sweeper.cli._sweep_console import SweepConsole, all_failed_line, resume_lines, sweep_header, sweep_summary
    from sweeper.sweep import run_study

    space, devices, workers = _checked_run(args)
    plan, setup_lines = _planned(args, space, devices, workers)
    _print("\n".join(sweep_header(plan)))
    for line in setup_lines + resume_lines(plan):
        _print(line)
    start = time.monotonic()
    console = SweepConsole(plan)
    try:
        run_study(plan, [console])
    finally:
        console.close()
    _confirm_top(plan)
    _publish(plan.study)
    elapsed_s = time.monotonic() - start
    out_of_time = plan.timeout_s is not None and elapsed_s >= plan.timeout_s
    _print("\n".join(sweep_summary(plan, elapsed_s=elapsed_s, out_of_time=out_of_time)))
    if console.all_failed:
        print(all_failed_line(plan, console.statuses), file=sys.stderr)
        return 1
    return 0


def _checked_run(args: argparse.Namespace) -> tuple[SearchSpace, list[str] | None, int]:
    """The space file read and checked, with the environment switches, its devices and its worker slots: one line
    of bad input before anything is opened.

    Raises:
        SpaceError: A bad space, switch or device list, or a space that searches nothing.
    """
    from sweeper.report import progress_interval_s

    space = _load(args)
    progress_interval_s()  # a bad SWEEPER_PROGRESS_INTERVAL_S is one line before anything is opened
    _check_trial_environment()  # and a bad SWEEPER_TRIAL_START or SWEEPER_WARM
    if not space.search:
        raise SpaceError(
            f"{args.space}: search: nothing to search (every key is fixed); give at least one key a "
            "list or a range, or use 'sweep trial' for one configuration"
        )
    devices = _devices(args.devices) if args.devices else None
    return space, devices, args.workers or (len(devices) if devices else 1)


def _planned(
    args: argparse.Namespace, space: SearchSpace, devices: list[str] | None, workers: int
) -> tuple[SweepPlan, list[str]]:
    """The sweep's plan (:func:`sweeper.sweep.plan_sweep`) on the card it reads and the data it checks, with the
    lines that say what it will train. Data that cannot train is refused before the storage is opened."""
    from sweeper.devices import cuda_visible
    from sweeper.sweep import plan_sweep, with_card
    from sweeper.trial import prestart

    if workers == 1 and not devices:  # the trial processes' imports run while the data is read and audited
        prestart()
    space, card, card_warnings = with_card(space, "cuda" if cuda_visible() else "cpu", devices)
    model_path, samples = _prepare(space.dataset, space.model)
    setup_lines, file = _setup_lines(space, model_path, samples, card)  # the data profiled once
    setup_lines[1:1] = card_warnings
    plan = plan_sweep(
        space,
        model_path,
        storage=args.storage,
        name=args.study,
        n_trials=args.n_trials,
        timeout_s=parse_duration_s(args.timeout) if args.timeout is not None else None,
        workers=workers,
        devices=devices,
        new_setup=args.new_setup,
        on_measure=lambda line: print(line, flush=True),
        longest_sample_tokens=file.longest or None,
        file_lengths=file,
        # the report names the card beside the cap; a CPU machine is no card (its size changes no figure there)
        card=None
        if card is None or card.device != "cuda"
        else {"device": card.device, "name": card.name, "total_memory_gib": card.total_memory_gib},
    )
    if space.study.confirm_steps is not None:  # the horizon every view gives the chance of diverging at, from trial 1
        plan.study.set_user_attr(StudyAttr.CONFIRM_STEPS, space.study.confirm_steps)
    # the whole file's rows that make a NaN step, for the exports, which train every row (issue 68)
    untrained = {str(n): rows for n in space.values_of("max_seq_length") if (rows := file.untrained_rows(n))}
    plan.study.set_user_attr(StudyAttr.UNTRAINED_ROWS, untrained)
    return plan, setup_lines


def _confirm_top(plan: SweepPlan) -> None:
    """After the sweep: confirm the safe pick and the front's trials nearest its knee (``study.confirm_top``) at
    ``study.confirm_steps``, recorded as the default of a later ``sweep confirm``."""
    from sweeper.cli._confirm import run_confirmations
    from sweeper.sweep import candidates

    study = plan.space.study
    if study.confirm_steps is not None:
        plan.study.set_user_attr(StudyAttr.CONFIRM_STEPS, study.confirm_steps)  # the default of a later 'sweep confirm'
    top = [t.number for t in candidates(plan.study)[: study.confirm_top]]
    if top:
        what = "the safe pick (what sweep export writes)" + (
            f" and the front's {len(top) - 1} nearest its knee" if len(top) > 1 else ""
        )
        _print(f"confirm {what} (study.confirm_top={study.confirm_top}):")
        run_confirmations(plan.study, top, study.confirm_steps)


def _setup_lines(
    space: SearchSpace, model_path: str, samples: list, card: Card | None = None
) -> tuple[list[str], FileLengths]:
    """What the sweep will train: the model, the data and the cap with its device (:func:`_describe_setup`), the
    rows no trial trains on, and the data audit's warnings; with the whole file's sample lengths
    (:func:`_data_warnings`)."""
    lines = [_describe_setup(space, model_path, len(samples), card)]
    profile = _profile(space, model_path, samples, audit=True)
    dropped = _dropped_rows_line(space, profile)
    if dropped:
        lines.append(dropped)
    return lines + _data_warnings(space, profile), profile.file
