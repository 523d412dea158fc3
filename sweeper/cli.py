"""The ``sweep`` command.

Exit codes (``SPEC.md``): 0 done (pruned trials are normal), 2 bad input (one line per problem: file, key, what is
wrong, the fix), 1 anything else, 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

from sweeper.config import Categorical, DatasetSpec, ModelSpec
from sweeper.errors import SpaceError, SweeperError
from sweeper.space import SearchSpace, load_space, parse_duration_s


def _print(text: str = "") -> None:
    print(text, flush=True)


def _prepare(dataset: DatasetSpec, model: ModelSpec) -> tuple[str, list]:
    """Read the data and resolve the model (converting the built-in GGUF once) before any trial starts, so a bad
    model or dataset is one clear error instead of a study of failed trials; both are checked, all problems reported.

    Returns:
        ``(model_path, samples)``: what :func:`sweeper.model.resolve_model` and :func:`sweeper.data.load_samples`
        return.
    """
    from sweeper.data import load_samples
    from sweeper.model import resolve_model

    problems: list[str] = []
    samples, model_path = [], ""
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
    if getattr(args, "study", None) is not None and not _STUDY_NAME.fullmatch(args.study):
        problems.append(f"--study: {args.study!r} is not a valid study name; use letters, digits, '.', '_' or '-'")
    if getattr(args, "n_trials", None) is not None and args.n_trials < 1:
        problems.append(f"--n-trials: {args.n_trials} is not a positive number of trials; give 1 or more")
    if getattr(args, "workers", None) is not None and not 1 <= args.workers <= MAX_WORKERS:
        problems.append(f"--workers: {args.workers} is not a number of workers from 1 to {MAX_WORKERS}; give e.g. "
                        "--workers 4")
    if getattr(args, "devices", None) is not None:
        devices = _devices(args.devices)
        if not all(_DEVICE.fullmatch(d) for d in devices) or len(set(devices)) != len(devices):
            problems.append(f"--devices: {args.devices!r} is not a list of distinct GPU indices or UUIDs; write e.g. "
                            "--devices 0,1,2,3")
    if problems:
        raise SpaceError(problems)
    return space


def _searched_values(space: SearchSpace, key: str) -> list:
    """The values a key takes in the sweep: a list's choices, a range's ends, or the fixed value."""
    dim = space.search.get(key)
    if dim is None:
        return [space.fixed[key]]
    if isinstance(dim, Categorical):
        return sorted(set(dim.choices))
    return sorted({int(dim.low), int(dim.high)} if dim.is_int else {dim.low, dim.high})


def _audit(samples: list, model: ModelSpec, model_path: str, max_seq_lengths: list[int]):
    """The samples tokenized as the trials tokenize them, audited at each length: ``(report, tokenized)``."""
    from sweeper.audit import audit_samples
    from sweeper.data import load_tokenizer, tokenize_samples
    from sweeper.model import model_vocab_size

    tokenizer = load_tokenizer(model_path, model.trust_remote_code)
    tokenized = tokenize_samples(samples, tokenizer, sys.maxsize)  # full length; the audit cuts per limit
    report = audit_samples(samples, tokenized, max_seq_lengths, model_vocab_size(model_path, model.trust_remote_code))
    return report, tokenized


def _data_warnings(space: SearchSpace, model_path: str, samples: list) -> list[str]:
    """Before the first trial: one line per finding that would make trials NaN at the searched ``max_seq_length``
    values (naming the batch sizes and the step where it strikes within ``max_steps``), or one line saying there is
    none, so that a data fault is never read as a hyperparameter result."""
    from sweeper.audit import first_nan_step

    lengths = _searched_values(space, "max_seq_length")
    report, tokenized = _audit(samples, space.model, model_path, lengths)
    batches = _searched_values(space, "per_device_train_batch_size")
    accumulation = _searched_values(space, "gradient_accumulation_steps")
    max_steps = max(_searched_values(space, "max_steps"))
    doctor = f"sweep doctor {space.path}"
    lines = []
    for finding in report.nan_findings:
        hits = {}
        for b in batches:
            for ga in accumulation:
                hit = first_nan_step(tokenized, finding.max_seq_length, b, ga, max_steps, report.vocab_size)
                if hit is not None and hit.kind == finding.kind:
                    hits[(b, ga)] = hit
        if hits:
            (b, ga), hit = min(hits.items(), key=lambda kv: kv[1].step)
            sizes = ", ".join(sorted({str(k[0]) for k in hits}, key=int))
            strikes = (f"batch {sizes} go{'es' if len(hits) == 1 else ''} NaN (batch {b}"
                       + (f", gradient_accumulation_steps {ga}" if len(accumulation) > 1 else "")
                       + f": step {hit.step}, sample{'s' if len(hit.samples) > 1 else ''} "
                       f"{', '.join(map(str, hit.samples[:6]))})")
        else:
            strikes = f"no step of the first {max_steps} is made only of them, a longer run would be"
        what = {"no_supervised_tokens": "no supervised token left (the reply is cut away)",
                "invalid_token_id": f"token ids outside the model's {report.vocab_size} embedding rows"}[finding.kind]
        lines.append(f"WARNING data: at max_seq_length={finding.max_seq_length}, {len(finding.samples)} of "
                     f"{report.samples} samples have {what}; {strikes}: a data fault, not a hyperparameter result "
                     f"({doctor})")
    others = sorted({f.kind for f in report.findings if not f.nan_risk})
    if not lines:
        lines.append(f"data    audited at max_seq_length {', '.join(map(str, report.max_seq_lengths))}: nothing that "
                     "would make a trial NaN" + (f"; also found: {', '.join(others)} ({doctor})" if others else ""))
    elif others:
        lines.append(f"data    also found: {', '.join(others)} ({doctor})")
    return lines


def _describe_setup(space: SearchSpace, model_path: str, n_samples: int) -> str:
    cap = space.fixed["memory_limit_gib"]
    lines = [
        f"model   {space.model.name_or_path}" + (f" ({model_path})" if model_path != space.model.name_or_path else ""),
        f"data    {space.dataset.path}: {n_samples} samples",
        f"memory  cap {cap:g} GiB per trial. CUDA: allocator cap, peak = max reserved. CPU: cap on private memory "
        "(RLIMIT_DATA), peak = resident set after loading, which also counts shared libraries (+-0.1 GiB between runs)",
    ]
    steps = space.fixed.get("max_steps")
    if "max_steps" not in space.search and steps is not None and steps < MIN_INFORMATIVE_STEPS:
        lines.append(f"note    max_steps={steps}: loss_spike and grad_norm_growth need about {MIN_INFORMATIVE_STEPS}+ "
                     "steps to separate configurations; NaN and OOM are measured at any length")
    if space.model.trust_remote_code:
        lines.append("WARNING trust_remote_code is on: the checkpoint's own Python code will run")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    """``sweep run SPACE.yaml``: create or resume the study and run trials until n_trials or the timeout."""
    import optuna

    from sweeper._coordination import heartbeat_interval_s, in_memory
    from sweeper._worker import _cuda_visible
    from sweeper.console import format_counts, format_data_nan_summary, format_front, format_params, format_trial_line
    from sweeper.runner import MAX_CONSECUTIVE_DUPLICATES, check_writable, run_study, slot_devices
    from sweeper.study import (
        count_finished,
        default_storage,
        nan_causes,
        open_study,
        pareto_front,
        redact_url,
        status_counts,
        study_dir,
        trial_dir,
    )
    from sweeper.trial import FAIL_STATUSES

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = _load(args)
    if not space.search:
        raise SpaceError(f"{args.space}: search: nothing to search (every key is fixed); give at least one key a "
                         "list or a range, or use 'sweep trial' for one configuration")
    timeout_s = parse_duration_s(args.timeout) if args.timeout is not None else None
    name = args.study or space.study.name
    storage = args.storage or space.study.storage or default_storage(name)
    n_trials = args.n_trials or space.study.n_trials
    devices = _devices(args.devices) if args.devices else None
    workers = args.workers or (len(devices) if devices else 1)
    heartbeat_interval_s()  # a bad SWEEPER_HEARTBEAT_INTERVAL_S is one line before anything runs
    if workers > 1 and in_memory(storage):
        raise SpaceError(f"--storage: {redact_url(storage)} is an in-memory database, one per connection, which "
                         f"--workers {workers} cannot share; give a file, e.g. --storage sqlite:///studies/{name}.db")
    model_path, samples = _prepare(space.dataset, space.model)
    check_writable(study_dir(name))  # before the storage is touched
    study = open_study(space, storage, name, n_trials)  # a storage problem is one line before any output
    already = count_finished(study)
    _print(f"sweep: study '{name}' in {redact_url(storage)}, {n_trials} trials, searching {', '.join(space.search)}")
    if workers > 1 or devices:
        slots = slot_devices(workers, devices)
        if any(d is not None for d in slots):
            shown = ", ".join(f"device {d}" if d is not None else "this machine" for d in slots)
        else:
            threads = max(1, (os.cpu_count() or 1) // workers)
            shown = f"on the CPU, {threads} thread{'s' if threads > 1 else ''} each"
        _print(f"workers {workers} trial{'s' if workers > 1 else ''} at once ({shown})")
        if devices and not _cuda_visible():
            _print("note    --devices names GPUs, but none is visible here: the trials run on the CPU")
    _print(_describe_setup(space, model_path, len(samples)))
    for line in _data_warnings(space, model_path, samples):
        _print(line)
    if 0 < already < n_trials:
        _print(f"resume  the study holds {already} finished trials; {n_trials - already} to go")
    start = time.monotonic()
    statuses: list[str] = []  # of the trials this run measured

    def on_start(number: int, params: dict, device: str | None) -> None:
        if workers > 1:
            shown = format_params({k: params.get(k) for k in space.search})
            _print(f"start   #{number:<3} {shown}" + (f"  [device {device}]" if device is not None else ""))

    def on_trial(event) -> None:
        params = {k: event.trial.params.get(k) for k in space.search}
        line = format_trial_line(event.trial.number, params, event.result, event.finished, event.n_trials)
        attrs = event.trial.user_attrs
        if "duplicate_of" not in attrs:
            statuses.append(event.result.status)
        if workers > 1 and "cuda_visible_devices" in attrs:
            line += f"  [device {attrs['cuda_visible_devices']}]"
        if "retry_of" in attrs:
            line += f"  (retry {attrs.get('retry_attempt', 1)} of #{attrs['retry_of']})"
        if attrs.get("retried"):
            line += "  (its configuration runs again: max_retries)"
        _print(line)

    if already >= n_trials:
        _print(f"the study already holds {already} finished trials (n_trials={n_trials}): nothing to run; "
               "raise --n-trials to measure more")
    run_study(space, model_path=model_path, storage=storage, study_name=name, n_trials=n_trials,
              timeout_s=timeout_s, on_trial=on_trial, on_note=lambda text: _print(f"note    {text}"),
              on_start=on_start, study=study, workers=workers, devices=devices)
    front = pareto_front(study)
    finished = count_finished(study)
    if finished < n_trials and (timeout_s is None or time.monotonic() - start < timeout_s):
        _print(f"stopped at {finished} of {n_trials} trials: the sampler proposed only configurations already "
               f"measured {MAX_CONSECUTIVE_DUPLICATES} times in a row; widen the search to measure more")
    _print()
    measured = sum(1 for t in study.get_trials(deepcopy=False) if "duplicate_of" not in t.user_attrs)
    _print(f"Pareto front (peak memory vs instability), {len(front)} of {measured} trials:")
    _print(format_front(front) if front else "  (no complete trial yet)")
    _print()
    _publish(study)
    causes = nan_causes(study)
    _print("trials: " + format_counts(status_counts(study), causes))
    if "data" in causes:
        samples = {t.number: t.user_attrs.get("nan_samples") or [] for t in study.get_trials(deepcopy=False)
                   if t.number in causes["data"]}
        trials_dir = trial_dir(name, 0).parent.as_posix()
        _print(format_data_nan_summary(causes, samples, trials_dir) + f"; see 'sweep doctor {space.path}'")
    ref = name if storage == default_storage(name) else f"'{redact_url(storage)}'"
    _print(f"done in {time.monotonic() - start:.0f} s; study in {redact_url(storage)}; next: sweep report {ref}, "
           f"sweep dashboard {ref}, sweep export {ref} --pick knee"
           + (" (with your password in place of ***)" if "***" in ref else ""))
    if statuses and all(s in FAIL_STATUSES for s in statuses):
        print(f"sweep: every trial this run started failed ({', '.join(sorted(set(statuses)))}): the machine or the "
              f"setup, not the hyperparameters; see the reasons above and {trial_dir(name, 0).parent}/N/worker.log",
              file=sys.stderr)
        return 1
    return 0


def _publish(study) -> None:
    """The front figure and failure notes for optuna-dashboard; a storage that refuses them costs only the figure."""
    from sweeper.dashboard import publish_study

    try:
        publish_study(study)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"sweep: the dashboard figure and notes were not stored ({exc})", file=sys.stderr)


def cmd_trial(args: argparse.Namespace) -> int:
    """``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""
    from sweeper.console import format_params, format_trace
    from sweeper.study import STUDIES_DIR
    from sweeper.trial import run_trial

    space = _load(args)
    config = space.trial_config(space.first_choices())
    model_path, samples = _prepare(space.dataset, space.model)
    folder = STUDIES_DIR / space.study.name / "manual" / time.strftime("%Y%m%d-%H%M%S")
    if not args.json:
        shown = ("r", "lora_alpha_ratio", "bnb_4bit_compute_dtype", "bnb_4bit_use_double_quant",
                 "bnb_4bit_quant_type", "per_device_train_batch_size", "max_seq_length", "learning_rate")
        _print(f"sweep trial: {format_params({k: getattr(config, k) for k in shown})}")
        _print(_describe_setup(space, model_path, len(samples)))
        _print(f"files   {folder}")
    result = run_trial(config, folder, model_path=model_path)
    if args.json:
        payload = {**result.to_dict(), "config": config.to_dict()}
        _print(json.dumps(payload, indent=2))
        return 0
    if result.loss_trace:
        _print(format_trace(result))
    _print(f"status  {result.status}: {result.reason}")
    if result.status == "nan":
        module = f", first non-finite output in {result.nan_module}" if result.nan_module else ""
        which = "samples at fault" if result.nan_cause == "data" else "samples of the failing step (not at fault)"
        _print(f"nan     cause {result.nan_cause or 'unknown'}{module}; {which}: "
               f"{', '.join(map(str, result.nan_samples)) or '-'}; the step's rows are in {folder / 'nan_batch.jsonl'}")
    if result.longest_sample_tokens is not None:
        _print(f"data    samples trained on: the longest has {result.longest_sample_tokens} tokens before truncation "
               f"(sample {result.longest_sample_index}); {100 * result.truncated_sample_fraction:.0f}% were cut at "
               f"max_seq_length={config.max_seq_length}; fewest supervised tokens in a step: "
               f"{result.min_supervised_tokens}")
    if result.peak_memory_gib is not None:
        load = f", {result.load_peak_memory_gib:.3f} GiB while loading" if result.load_peak_memory_gib else ""
        _print(f"memory  {result.peak_memory_gib:.3f} GiB ({result.memory_kind}{load})")
    if result.instability is not None:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in result.instability_components.items())
        _print(f"instability {result.instability:.3f} ({parts})")
    times = [f"{k.removesuffix('_time_s')} {getattr(result, k):.1f} s" for k in
             ("import_time_s", "load_time_s", "train_time_s") if getattr(result, k) is not None]
    if result.wall_time_s is not None:
        times.append(f"total {result.wall_time_s:.1f} s")
    _print("time    " + ", ".join(times))
    return 0


#: Below this many steps the trend terms of instability are mostly batch-to-batch noise (see sweeper.stability).
MIN_INFORMATIVE_STEPS = 6

_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

#: A CUDA_VISIBLE_DEVICES entry: an index, or a GPU/MIG UUID.
_DEVICE = re.compile(r"\d{1,3}|(GPU|MIG)-[A-Za-z0-9/-]{1,80}")

def _devices(text: str) -> list[str]:
    """``--devices 0,1`` as its entries."""
    return [d.strip() for d in text.split(",")]


#: More worker threads than this in one process is a typo (a GPU box has up to 16 GPUs; CPU trials need cores).
MAX_WORKERS = 64


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (what is wrong, where to look) and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: {message}; see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sweep`` (exposed for tests and docs)."""
    from sweeper.cli_readers import (
        DOCTOR_DEFAULT_LENGTHS,
        cmd_dashboard,
        cmd_doctor,
        cmd_estimate,
        cmd_export,
        cmd_report,
    )

    parser = _Parser(prog="sweep", description="QLoRA stability sweeper: a Pareto front of peak "
                                     "memory against instability, from short real runs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = sub.choices  # name -> subparser, for usage errors that name the subcommand

    run = sub.add_parser("run", help="create or resume a study and run trials until n_trials")
    run.add_argument("space", help="space file, e.g. search_spaces/demo.yaml")
    run.add_argument("--n-trials", type=int, help="trials the study should hold (over the whole study)")
    run.add_argument("--timeout", help="stop starting trials after this long, e.g. 8h")
    run.add_argument("--storage", help="optuna storage URL (default sqlite:///studies/<name>.db)")
    run.add_argument("--study", help="study name (default: study.name of the file)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the file")
    run.add_argument("--workers", type=int, metavar="N",
                     help="trials run at once, each in its own worker process (default 1, or one per --devices entry)")
    run.add_argument("--devices", metavar="0,1,...", help="CUDA_VISIBLE_DEVICES of the workers, given in turn "
                                                         "(default: every visible GPU, when --workers > 1)")
    run.set_defaults(func=cmd_run)

    trial = sub.add_parser("trial", help="run one trial in the foreground and print its trace")
    trial.add_argument("space", help="space file; unset searched keys take their first choice")
    trial.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. --set r=64")
    trial.add_argument("--json", action="store_true", help="print the result and its attributes as JSON")
    trial.set_defaults(func=cmd_trial)

    doctor = sub.add_parser("doctor", help="audit a dataset as the trials would tokenize it")
    doctor.add_argument("target", help="a space file (its dataset, model and max_seq_length values), or a dataset: "
                                       ".jsonl/.json/.csv/.parquet file, hub id or builtin:pydoc-topics")
    doctor.add_argument("--model", help="whose tokenizer and vocabulary to use (default: the space's model, or "
                                        "builtin:smollm2-135m-instruct for a bare dataset)")
    doctor.add_argument("--max-seq-length", type=int, action="extend", nargs="+", metavar="N",
                        help="limits to audit at (default: the space's max_seq_length values, or "
                             + ", ".join(map(str, DOCTOR_DEFAULT_LENGTHS)) + ")")
    doctor.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the file")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--strict", action="store_true", help="exit 1 when a finding would make a trial NaN")
    doctor.set_defaults(func=cmd_doctor)

    estimate = sub.add_parser("estimate", help="predicted peak GPU memory of the space's configurations, no weights")
    estimate.add_argument("space", help="space file; the model may be a folder holding only config.json")
    estimate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the file")
    estimate.add_argument("--json", action="store_true", help="print {points, frontier} as JSON")
    estimate.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                          help="predict a GPU's reserved memory (default) or a CPU trial's resident set (the demo)")
    estimate.set_defaults(func=cmd_estimate)

    report = sub.add_parser("report", help="the Pareto front and failures of a study, in the terminal and in HTML")
    report.add_argument("study", help="study name (studies/NAME.db), .db path or storage URL")
    report.add_argument("--html", metavar="PATH", help="where to write the HTML (default studies/<study>/report.html)")
    report.add_argument("--json", action="store_true",
                        help="print the report as JSON instead of tables (writes the HTML only with --html)")
    report.set_defaults(func=cmd_report)

    from sweeper.export import FORMATS, PICKS

    export = sub.add_parser("export", help="a trial of the study as a config for production training")
    export.add_argument("study", help="study name (studies/NAME.db), .db path or storage URL")
    which = export.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, metavar="N", help="export this trial (it must have completed)")
    which.add_argument("--pick", choices=PICKS, default="knee",
                       help="a point of the front: knee (best trade-off, the default), min-memory or most-stable")
    export.add_argument("--format", choices=FORMATS, default="hf", help="hf (default), trl, axolotl, llama-factory, json")
    export.add_argument("-o", "--output", metavar="PATH",
                        help="file to write; its suffix is set by the format (default studies/<study>/exports/)")
    export.set_defaults(func=cmd_export)

    dashboard = sub.add_parser("dashboard", help="optuna-dashboard on the study, with the trials' artifacts")
    dashboard.add_argument("study", help="study name (studies/NAME.db), .db path or storage URL")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine "
                                                               "only)")
    dashboard.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    dashboard.set_defaults(func=cmd_dashboard)
    return parser


def _storage_failure(exc: BaseException) -> str | None:
    """One line for a study storage that failed while in use (disk full, server gone), or None for other errors."""
    if "optuna" not in sys.modules and "sqlalchemy" not in sys.modules:
        return None
    import optuna

    cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else exc
    if not (isinstance(exc, optuna.exceptions.StorageInternalError) or type(cause).__module__.startswith("sqlalchemy")):
        return None
    from sweeper.study import redact_url

    text = str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__]
    return (f"sweep: the study storage failed ({redact_url(text[0][:200])}); SQLite and PostgreSQL roll back a failed "
            "write, so finished trials are kept: fix the cause (a full disk, a stopped server) and run the same "
            "command to resume")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sweep``; returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the subcommand's help, not the top-level one
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except SweeperError as exc:
        if args.debug:
            traceback.print_exc()
        for line in exc.problems:
            print(line, file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `sweep ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        line = _storage_failure(exc)
        if line is None:
            raise
        if args.debug:
            traceback.print_exc()
        print(line, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        running = args.command in ("run", "trial")
        print("sweep: interrupted" + ("; the running trials were stopped and recorded as interrupted" if running
                                      else "; files already written are complete"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
