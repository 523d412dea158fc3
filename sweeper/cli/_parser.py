"""The command line's parser: the subcommands of ``sweep``, their flags and help (:func:`build_parser`); each
subcommand runs in a module of its own."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (what is wrong, where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}; see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


#: ``--set`` help of the commands that read a space file.
_SET_HELP = "override a key of the file"


def _parent(*, study: bool = False, set_help: str | None = None, json_help: str | None = None) -> _Parser:
    """A parent parser (for ``parents=[...]``) holding the arguments several commands share, each with its command's
    help: the ``study`` positional, ``--set`` and ``--json``; without arguments, an empty one to fill.

    argparse adds a command's parents' arguments before its own, in the parents' order, so a command whose --help
    lists some of its own options before a shared one puts those in an empty parent of their own ahead of it.
    """
    parent = _Parser(add_help=False)
    if study:
        parent.add_argument("study", help="study name (studies/NAME.db), .db path, journal .log path or storage URL")
    if set_help is not None:
        parent.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    if json_help is not None:
        parent.add_argument("--json", action="store_true", help=json_help)
    return parent


def _version() -> str:
    """The installed sweeper's version (its package metadata), or ``unknown`` when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("sweeper")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sweep`` (exposed for tests and docs)."""
    parser = _Parser(
        prog="sweep",
        description="QLoRA stability sweeper: a Pareto front of peak memory against stability margin, from short real "
        "runs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"sweep {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = sub.choices  # type: ignore[attr-defined]  # name -> subparser, for usage errors
    commands = (
        _add_init,
        _add_run,
        _add_trial,
        _add_doctor,
        _add_estimate,
        _add_report,
        _add_export,
        _add_confirm,
        _add_calibrate,
        _add_dashboard,
    )
    for add_command in commands:  # in the order of `sweep --help`
        add_command(sub)
    return parser


def _add_init(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._init import cmd_init

    init = sub.add_parser(
        "init",
        help="a space file from your own training config (axolotl, LLaMA-Factory or TRL YAML, or a JSON of keyword "
        "arguments), every key of it accounted for",
    )
    init.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="FILE",
        help="your training config: an axolotl, LLaMA-Factory or TRL --config .yaml, or a .json of keyword arguments",
    )
    init.add_argument("-o", "--output", metavar="PATH", help="the space file to write (default space.yaml)")
    init.add_argument("--force", action="store_true", help="replace the space file if it exists")
    init.set_defaults(func=cmd_init)


def _add_run(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._run import cmd_run

    head = _parent()
    head.add_argument("space", help="space file, e.g. search_spaces/demo.yaml")
    head.add_argument("--n-trials", type=int, help="trials the study should hold (over the whole study)")
    head.add_argument("--timeout", help="stop starting trials after this long, e.g. 8h")
    head.add_argument(
        "--storage",
        help="optuna storage: sqlite:///PATH.db (default sqlite:///studies/<name>.db), postgresql://... or mysql://... "
        "to share it between machines, journal:///PATH.log for a journal file on a shared filesystem",
    )
    head.add_argument("--study", help="study name (default: study.name of the file)")
    run = sub.add_parser(
        "run",
        help="create or resume a study and run trials until n_trials",
        parents=[head, _parent(set_help=_SET_HELP)],
    )
    run.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="trials run at once, each in its own trial process (default 1, or one per --devices entry)",
    )
    run.add_argument(
        "--devices",
        metavar="0,1,...",
        help="CUDA_VISIBLE_DEVICES of the workers, given in turn (default: every visible GPU, when --workers > 1)",
    )
    run.add_argument(
        "--new-setup",
        action="store_true",
        help="resume a study under changed data, model, horizon or training keys, kept apart from its earlier trials",
    )
    run.set_defaults(func=cmd_run)


def _add_trial(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._trial import cmd_trial

    shared = _parent(set_help="e.g. --set r=64", json_help="print the result and its attributes as JSON")
    trial = sub.add_parser("trial", help="run one trial in the foreground and print its trace", parents=[shared])
    trial.add_argument("space", help="space file; unset searched keys take their first choice")
    trial.set_defaults(func=cmd_trial)


def _add_doctor(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._doctor import DOCTOR_DEFAULT_LENGTHS, cmd_doctor

    head = _parent()
    head.add_argument(
        "target",
        help="a space file (its dataset, model and max_seq_length values), or a dataset: "
        ".jsonl/.json/.csv/.parquet file, hub id or builtin:pydoc-topics",
    )
    head.add_argument(
        "--model",
        help="whose tokenizer and vocabulary to use (default: the space's model, or "
        "builtin:smollm2-135m-instruct for a bare dataset)",
    )
    head.add_argument(
        "--max-seq-length",
        type=int,
        action="extend",
        nargs="+",
        metavar="N",
        help="limits to audit at (default: the space's max_seq_length values, or "
        + ", ".join(map(str, DOCTOR_DEFAULT_LENGTHS))
        + ")",
    )
    doctor = sub.add_parser(
        "doctor",
        help="audit a dataset as the trials would tokenize it",
        parents=[head, _parent(set_help=_SET_HELP, json_help="print the report as JSON")],
    )
    doctor.add_argument("--strict", action="store_true", help="exit 1 when a finding would make a trial NaN")
    doctor.set_defaults(func=cmd_doctor)


def _add_estimate(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._estimate import cmd_estimate

    estimate = sub.add_parser(
        "estimate",
        help="predicted peak GPU memory of the space's configurations, no weights",
        parents=[
            _parent(set_help=_SET_HELP, json_help="print {model, device, memory_limit_gib, points, frontier} as JSON")
        ],
    )
    estimate.add_argument("space", help="space file; the model may be a folder holding only config.json")
    estimate.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="predict a GPU's reserved memory (default) or a CPU trial's resident set (the demo)",
    )
    estimate.add_argument(
        "--card-gib",
        type=float,
        metavar="GIB",
        help="plan for a card that is not on this machine: its size as torch reports it (total_memory in GiB; an "
        "RTX 4090 is 23.6), which memory_limit_gib: auto and the cap check read instead of this machine's device",
    )
    estimate.set_defaults(func=cmd_estimate)


def _add_report(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._report import cmd_report

    html = _parent()
    html.add_argument("--html", metavar="PATH", help="where to write the HTML (default studies/<study>/report.html)")
    shared = _parent(json_help="print the report as JSON instead of tables (writes the HTML only with --html)")
    report = sub.add_parser(
        "report",
        help="the Pareto front and failures of a study, in the terminal and in HTML",
        parents=[_parent(study=True), html, shared],
    )
    _add_horizon(report)
    report.set_defaults(func=cmd_report)


def _add_export(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._export import cmd_export
    from sweeper.export import EXPORT_FORMATS, format_names
    from sweeper.study.picks import PICKS

    export = sub.add_parser(
        "export", help="a trial of the study as a config for production training", parents=[_parent(study=True)]
    )
    which = export.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, metavar="N", help="export this trial (it must have completed)")
    which.add_argument(
        "--pick",
        choices=PICKS,
        default="safe",
        help="a point of the front (its line says what it chose among; a confirmed trial is preferred when as good "
        "within the noise): safe (the default: the least memory among the trials safely below their edge, headroom "
        "predicted_max_lr/learning_rate "
        "at or above its safety factor, leaving out those that learn under half as fast as the fastest of them; "
        "within 10%% of that memory, the seed's noise on peak memory, the one that learns most), knee (best "
        "trade-off), min-memory, most-stable (least memory among those tied with the most stable)",
    )
    default = "hf"
    export.add_argument(
        "--format",
        choices=format_names(),
        default=default,
        help="; ".join(f"{f.name}{' (default)' if f.name == default else ''}: {f.help}" for f in EXPORT_FORMATS),
    )
    export.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file to write; its suffix is set by the format (default studies/<study>/exports/)",
    )
    export.add_argument(
        "--onto",
        metavar="FILE",
        help="write the trial's measured keys onto your own training config (axolotl, LLaMA-Factory or TRL YAML, or "
        "JSON; the file's tool is the format): the same file with only those keys changed, its comments and order "
        "kept, the diff printed; -o names where (default FILE itself, the original kept as FILE.orig); a file of "
        "another model is refused unless --force",
    )
    export.add_argument(
        "--force", action="store_true", help="replace an earlier export even if it was edited since it was written"
    )
    _add_horizon(export, "the --onto file's max_steps, else study.confirm_steps, else 400")
    export.set_defaults(func=cmd_export)


def _add_confirm(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._confirm import cmd_confirm
    from sweeper.study.picks import PICKS

    confirm = sub.add_parser(
        "confirm",
        help="run the chosen trials again at a long horizon (by default the safe pick)",
        parents=[_parent(study=True)],
    )
    _add_steps(confirm, "the long run")
    chosen = confirm.add_mutually_exclusive_group()
    chosen.add_argument("--trials", metavar="3,7", help="these trials")
    chosen.add_argument(
        "--front", action="store_true", help="every trial of the front, the safe pick first, then nearest the knee"
    )
    chosen.add_argument(
        "--pick", choices=PICKS, default="safe", help="a point of the front, as sweep export picks it (default safe)"
    )
    confirm.add_argument(
        "--as-exported",
        action="store_true",
        help="run the configuration sweep export writes: its gradient_accumulation_steps, so its effective batch "
        "(target_effective_batch_size); by default the trial's own, and the line says the difference",
    )
    confirm.set_defaults(func=cmd_confirm)


def _steps(text: str) -> int:
    """A whole number of steps, at least 1 (argparse's ``type``: a bad value is one usage line)."""
    try:
        steps = int(text)
    except ValueError:
        steps = 0
    if steps < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps, at least 1, got {text!r}")
    return steps


def _add_horizon(parser: argparse.ArgumentParser, default: str = "study.confirm_steps, else 400") -> None:
    """``--horizon STEPS``: the run length the chance of diverging is for, in ``sweep report`` and ``sweep export``
    (``default``: what stands for it when it is not given, as the help says it)."""
    parser.add_argument(
        "--horizon",
        type=_steps,
        metavar="STEPS",
        help="the length of your run in optimizer steps: the chance of diverging, its call and the safe "
        f"learning_rate are for a run this long (default: {default}); a longer run is riskier at the same rate",
    )


def _add_steps(parser: argparse.ArgumentParser, run: str) -> None:
    """``--steps N``, the horizon of ``sweep confirm``'s and ``sweep calibrate``'s long runs."""
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help=f"steps of {run} (default: study.confirm_steps, else 10x the trial's max_steps)",
    )


def _add_calibrate(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._calibrate import cmd_calibrate

    calibrate = sub.add_parser(
        "calibrate",
        help="measure the study's own predicted_max_lr factor: bisect the long-run edge of a few trials",
        description="Bisect the constant learning rate at which a run of the study's long horizon fails, for a few "
        "trials (the front's, then other complete ones; or --trials), on the study's own model and data, within "
        "--runs runs (and --hours); store the study's factor (edge over lr_ceiling) with its spread. From then on "
        "every predicted_max_lr of the study uses it and says so. Each run is kept as it ends: after a stop, the "
        "same command goes on.",
        parents=[_parent(study=True)],
    )
    _add_steps(calibrate, "each long run")
    calibrate.add_argument(
        "--trials",
        metavar="3,7",
        help="these trials (default: the front's, then the other complete trials with a measured lr_ceiling)",
    )
    calibrate.add_argument("--runs", type=int, default=12, metavar="N", help="long runs at most (default 12)")
    calibrate.add_argument("--hours", type=float, metavar="H", help="stop starting runs after H hours")
    calibrate.add_argument(
        "--resolution",
        type=float,
        default=1.5,
        metavar="F",
        help="bracket each edge to within this factor (default 1.5)",
    )
    calibrate.set_defaults(func=cmd_calibrate)


def _add_dashboard(sub: argparse._SubParsersAction[_Parser]) -> None:
    from sweeper.cli._dashboard import cmd_dashboard

    dashboard = sub.add_parser(
        "dashboard", help="optuna-dashboard on the study, with the trials' artifacts", parents=[_parent(study=True)]
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    dashboard.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    dashboard.set_defaults(func=cmd_dashboard)
