"""``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from sweeper.cli._common import (
    _check_trial_environment,
    _load,
    _prepare,
    _print,
    _profile,
)
from sweeper.cli._setup_text import _describe_setup, _dropped_rows_line
from sweeper.errors import SpaceError


def manual_trial_folder(parent: Path) -> Path:
    """A new folder for one ``sweep trial`` under ``parent``, created here: ``YYYYmmdd-HHMMSS``, with ``-2``,
    ``-3`` ... when another trial took that second's name (two ``sweep trial`` started in the same second in one
    project shared a folder, and each printed the other's result)."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        folder = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise AssertionError("unreachable")


def cmd_trial(args: argparse.Namespace) -> int:
    """``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""
    from sweeper.devices import cuda_visible
    from sweeper.report import (
        LiveProgress,
        format_file_rows,
        format_untrained_rows,
        trial_header,
        trial_result_lines,
    )
    from sweeper.stability import derive_margin_figures
    from sweeper.storage import study_dir
    from sweeper.sweep import check_setup, with_card
    from sweeper.trial import Measures, run_trial

    _check_trial_environment()  # a bad SWEEPER_TRIAL_START or SWEEPER_WARM is one line, never ignored
    space, card, card_warnings = with_card(_load(args), "cuda" if cuda_visible() else "cpu")
    config = space.trial_config(space.first_choices())
    model_path, samples = _prepare(space.dataset, space.model)
    setup = check_setup(space, model_path)  # what would fail the trial before it trains: one line each, exit 2
    if setup:
        raise SpaceError(setup)
    profile = _profile(space, model_path, samples, audit=False)  # the data profiled once
    dropped = _dropped_rows_line(space, profile)  # refuses a batch above the data's rows: before a folder
    worst = profile.file.trial_worst_step(config.max_seq_length, config.per_device_train_batch_size, config.packing)
    folder = manual_trial_folder(study_dir(space.study.name) / "manual")
    header = [] if args.json else trial_header(config, _describe_setup(space, model_path, len(samples), card), folder)
    whole = format_file_rows(profile.file)
    # the whole file's rows that make a NaN step, before the trial (issue 68): its worst-case step may train them
    untrained = format_untrained_rows(profile.file, [config.max_seq_length], space.doctor_command())
    _say(header, [*card_warnings, dropped, f"data    {whole}" if whole else None, *untrained], json_out=args.json)
    # The live display goes where the lines go; with --json, stdout is one JSON document: the display goes to stderr.
    live = LiveProgress(1, stream=sys.stderr if args.json else sys.stdout)
    live.begin(0, 0)
    try:
        result = run_trial(
            config,
            folder,
            model_path=model_path,
            on_progress=lambda progress: live.report(0, progress),
            measures=Measures(worst_case_samples=worst or ()),
        )
    finally:
        live.close()
    # the chance of diverging at the space's long-run horizon (the trial process gives it at 400 steps)
    derive_margin_figures(result.stress, config.learning_rate, None, space.study.confirm_steps)
    if args.json:
        payload = {**result.to_dict(), "config": config.to_dict()}
        _print(json.dumps(payload, indent=2))
        return 0
    for line in trial_result_lines(result, config, folder):
        _print(line)
    return 0


def _say(header: list[str], notes: list[str | None], *, json_out: bool) -> None:
    """The trial's header, then its notes (the card's warnings, the unused rows, the whole file's rows; None left
    out); with ``--json`` the notes go to stderr, so that stdout stays one JSON document."""
    for line in header:
        _print(line)
    for text in notes:
        if text:
            print(text, file=sys.stderr if json_out else sys.stdout, flush=True)
