"""What the ``sweep`` commands share: printing, reading a space file with the command line's values (devices,
workers, study names), reading the data and resolving the model before any trial, the data profiled once, the trial
processes' environment switches, the study folder's owner, and publishing the dashboard figure. The setup's lines
are :mod:`sweeper.cli._setup_text`.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from sweeper.errors import SpaceError, SweeperError
from sweeper.space import DatasetSpec, ModelSpec, SearchSpace, load_space, name_problem, parse_duration_s

if TYPE_CHECKING:
    from sweeper.audit import DataProfile


def _print(text: str = "") -> None:
    print(text, flush=True)


def _prepare(dataset: DatasetSpec, model: ModelSpec) -> tuple[str, list[Any]]:
    """Read the data and resolve the model (converting the built-in GGUF once) before any trial starts, so a bad
    model or dataset is one clear error instead of a study of failed trials; both are checked, all problems reported.

    Returns:
        ``(model_path, samples)``: what :func:`sweeper.model.resolve_model` and :func:`sweeper.data.load_samples`
        return.
    """
    from sweeper.data import load_samples
    from sweeper.model import resolve_model

    problems: list[str] = []
    samples: list[Any] = []
    model_path = ""
    try:
        samples = load_samples(dataset)
    except SweeperError as exc:
        problems += exc.problems
    try:
        model_path = resolve_model(model)
    except SweeperError as exc:
        problems += exc.problems
    if problems:
        raise SweeperError(problems)
    return model_path, samples


def _load(args: argparse.Namespace) -> SearchSpace:
    """The space file with its overrides, and the command-line values checked with it: all problems at once."""
    problems: list[str] = []
    space = None
    try:
        space = load_space(args.space, args.set)
    except SpaceError as exc:
        problems += exc.problems
    if getattr(args, "timeout", None) is not None:
        try:
            parse_duration_s(args.timeout)
        except ValueError:
            problems.append(f"--timeout: {args.timeout!r} is not a duration; write e.g. 90s, 20m or 8h")
    if getattr(args, "study", None) is not None and (not _STUDY_NAME.fullmatch(args.study) or name_problem(args.study)):
        why = name_problem(args.study) or "it is not a file name"
        shown = args.study if len(args.study) <= 40 else args.study[:37] + "..."
        problems.append(
            f"--study: {shown!r} is not a valid study name: {why}; use a letter or digit, then up to 99 letters, "
            "digits, '.', '_' or '-'"
        )
    if getattr(args, "n_trials", None) is not None and args.n_trials < 1:
        problems.append(f"--n-trials: {args.n_trials} is not a positive number of trials; give 1 or more")
    if getattr(args, "workers", None) is not None and not 1 <= args.workers <= MAX_WORKERS:
        problems.append(
            f"--workers: {args.workers} is not a number of workers from 1 to {MAX_WORKERS}; give e.g. --workers 4"
        )
    if getattr(args, "devices", None) is not None:
        devices = _devices(args.devices)
        if not all(_DEVICE.fullmatch(d) for d in devices) or len(set(devices)) != len(devices):
            problems.append(
                f"--devices: {args.devices!r} is not a list of distinct GPU indices or UUIDs; write e.g. "
                "--devices 0,1,2,3"
            )
        else:
            problems.extend(_missing_devices(devices))
    if problems or space is None:
        raise SpaceError(problems)
    return space


def _profile(space: SearchSpace, model_path: str, samples: list[Any], *, audit: bool) -> DataProfile:
    """The command's data profiled once (:func:`sweeper.audit.profile_data`) at the searched ``max_seq_length``
    values: the tokenizer loaded once, the samples tokenized once, the unused rows, the whole file's lengths, and
    with ``audit`` the audit."""
    from sweeper.audit import profile_data

    return profile_data(samples, space.dataset, space.model, model_path, space.values_of("max_seq_length"), audit=audit)


#: The environment switches of the trial processes, and the values each takes (a typo is one line, never ignored):
#: ``SWEEPER_TRIAL_START=exec`` starts every trial process with ``python -m`` (sweeper.trial._zygote.START_ENV);
#: ``SWEEPER_WARM=0`` starts a fresh process for every trial (sweeper.sweep._running).
TRIAL_ENVIRONMENT = {
    "SWEEPER_TRIAL_START": ("exec", "unset it (trial processes forked from a zygote where they can be), or give exec"),
    "SWEEPER_WARM": ("0", "unset it or give 1 (warm trial processes), or give 0 (a fresh process per trial)"),
}


def _check_trial_environment() -> None:
    """Refuse an environment switch of the trial processes set to a value it does not take (one line each).

    Raises:
        StudyError: ``SWEEPER_TRIAL_START`` or ``SWEEPER_WARM`` set to another value.
    """
    import os

    from sweeper.errors import StudyError

    problems = []
    for name, (value, fix) in TRIAL_ENVIRONMENT.items():
        raw = os.environ.get(name, "")
        if raw.strip() and raw not in (value, "1" if name == "SWEEPER_WARM" else value):
            problems.append(f"{name}: {raw[:40]!r} is not a value it takes; {fix}")
    if problems:
        raise StudyError(problems)


def _publish(study: Any) -> None:
    """The front figure and failure notes for optuna-dashboard; a storage that refuses them costs only the figure."""
    from sweeper.report import publish_study

    try:
        publish_study(study)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"sweep: the dashboard figure and notes were not stored ({exc})", file=sys.stderr)


_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

#: A CUDA_VISIBLE_DEVICES entry: an index, or a GPU/MIG UUID.
_DEVICE = re.compile(r"\d{1,3}|(GPU|MIG)-[A-Za-z0-9/-]{1,80}")


def _missing_devices(devices: list[str]) -> list[str]:
    """One line when ``--devices`` names GPUs this machine does not have: none at all (no NVIDIA driver: the trials
    would run on the CPU whatever it says), or an index at or above the count of ``/dev/nvidiaN``."""
    from pathlib import Path

    from sweeper.devices import cuda_visible

    if not cuda_visible():
        return [
            f"--devices: {','.join(devices)}: no GPU is visible on this machine (no NVIDIA driver), so the trials run "
            "on the CPU; leave --devices out"
        ]
    count = len(list(Path("/dev").glob("nvidia[0-9]*")))
    absent = [d for d in devices if d.isdigit() and count and int(d) >= count]
    if absent:
        return [f"--devices: GPU {absent[0]} does not exist: this machine has {count} (0 to {count - 1}); give those"]
    return []


def _devices(text: str) -> list[str]:
    """``--devices 0,1`` as its entries."""
    return [d.strip() for d in text.split(",")]


#: More worker threads than this in one process is a typo (a GPU box has up to 16 GPUs; CPU trials need cores).
MAX_WORKERS = 64


def _study_ref(ref: str) -> str:
    """STUDY as the user gave it, fit to be shown in a hint: a URL's password redacted, quoted."""
    from sweeper.storage import redact_url

    return f"'{redact_url(ref)}'" if "://" in ref else ref


def _check_owner(study: Any, url: str, fix: str) -> None:
    """Refuse to write into ``studies/<name>/`` when it holds another study's files (another database with a study of
    that name, or a copy of this one's used in the same folder: :func:`sweeper.storage._identity.check_study_owner`):
    one line, the owner's fix and ``fix`` (the option that writes elsewhere).

    Raises:
        StudyError: The folder is another study's, or cannot be written.
    """
    from sweeper.errors import StudyError
    from sweeper.storage import check_study_owner

    try:
        check_study_owner(study, url)
    except StudyError as exc:
        raise StudyError(f"{exc.problems[0]}; {fix}") from None
