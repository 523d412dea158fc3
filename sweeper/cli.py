"""The ``sweep`` command.

Exit codes (``SPEC.md``): 0 done (pruned trials are normal), 2 bad input (one line per problem: file, key, what is
wrong, the fix), 1 anything else, 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from sweeper.errors import SpaceError, SweeperError
from sweeper.space import SearchSpace, load_space, parse_duration_s


def _print(text: str = "") -> None:
    print(text, flush=True)


def _prepare(space: SearchSpace) -> tuple[str, int]:
    """Resolve the model (converting the built-in GGUF once) and read the data, before any trial starts, so a bad
    model or dataset is one clear error instead of a study of failed trials."""
    from sweeper.data import load_samples
    from sweeper.model import resolve_model

    samples = load_samples(space.dataset)
    return resolve_model(space.model), len(samples)


def _describe_setup(space: SearchSpace, model_path: str, n_samples: int) -> str:
    cap = space.fixed["memory_limit_gib"]
    lines = [
        f"model   {space.model.name_or_path}" + (f" ({model_path})" if model_path != space.model.name_or_path else ""),
        f"data    {space.dataset.path}: {n_samples} samples",
        f"memory  cap {cap:g} GiB per trial (CUDA: allocator fraction; CPU: RLIMIT_DATA, peak resident set measured)",
    ]
    if space.model.trust_remote_code:
        lines.append("WARNING trust_remote_code is on: the checkpoint's own Python code will run")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    """``sweep run SPACE.yaml``: create or resume the study and run trials until n_trials or the timeout."""
    import optuna

    from sweeper.console import format_counts, format_front, format_trial_line
    from sweeper.study import (
        MAX_CONSECUTIVE_DUPLICATES,
        default_storage,
        is_finished,
        pareto_front,
        run_study,
        status_counts,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = load_space(args.space, args.set)
    if not space.search:
        raise SpaceError(f"{args.space}: search: nothing to search (every key is fixed); give at least one key a "
                         "list or a range, or use 'sweep trial' for one configuration")
    timeout_s = parse_duration_s(args.timeout) if args.timeout else None
    name = args.study or space.study.name
    storage = args.storage or space.study.storage or default_storage(name)
    n_trials = args.n_trials or space.study.n_trials
    model_path, n_samples = _prepare(space)
    _print(f"sweep: study '{name}' in {storage}, {n_trials} trials, searching {', '.join(space.search)}")
    _print(_describe_setup(space, model_path, n_samples))
    start = time.monotonic()

    def on_trial(event) -> None:
        params = {k: event.trial.params.get(k) for k in space.search}
        _print(format_trial_line(event.trial.number, params, event.result, event.finished, event.n_trials))

    study = run_study(space, model_path=model_path, storage=storage, study_name=name, n_trials=n_trials,
                      timeout_s=timeout_s, on_trial=on_trial)
    front = pareto_front(study)
    finished = sum(1 for t in study.get_trials(deepcopy=False) if is_finished(t))
    if finished < n_trials and (timeout_s is None or time.monotonic() - start < timeout_s):
        _print(f"stopped at {finished} of {n_trials} trials: the sampler proposed only configurations already "
               f"measured {MAX_CONSECUTIVE_DUPLICATES} times in a row; widen the search to measure more")
    _print()
    _print(f"Pareto front (peak memory vs instability), {len(front)} of {len(study.trials)} trials:")
    _print(format_front(front) if front else "  (no complete trial yet)")
    _print()
    _print("trials: " + format_counts(status_counts(study)))
    _print(f"done in {time.monotonic() - start:.0f} s; study in {storage}; "
           f"optuna-dashboard {storage}")
    return 0


def cmd_trial(args: argparse.Namespace) -> int:
    """``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""
    from sweeper.console import format_params, format_trace
    from sweeper.study import STUDIES_DIR
    from sweeper.trial import run_trial

    space = load_space(args.space, args.set)
    config = space.trial_config(space.first_choices())
    model_path, n_samples = _prepare(space)
    folder = STUDIES_DIR / space.study.name / "manual" / time.strftime("%Y%m%d-%H%M%S")
    if not args.json:
        shown = ("r", "lora_alpha_ratio", "bnb_4bit_compute_dtype", "bnb_4bit_use_double_quant",
                 "bnb_4bit_quant_type", "per_device_train_batch_size", "max_seq_length", "learning_rate")
        _print(f"sweep trial: {format_params({k: getattr(config, k) for k in shown})}")
        _print(_describe_setup(space, model_path, n_samples))
        _print(f"files   {folder}")
    result = run_trial(config, folder, model_path=model_path)
    if args.json:
        payload = {**result.to_dict(), "config": config.to_dict()}
        _print(json.dumps(payload, indent=2))
        return 0
    if result.loss_trace:
        _print(format_trace(result))
    _print(f"status  {result.status}: {result.reason}")
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sweep`` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="sweep", description="QLoRA stability sweeper: a Pareto front of peak "
                                     "memory against instability, from short real runs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="create or resume a study and run trials until n_trials")
    run.add_argument("space", help="space file, e.g. search_spaces/demo.yaml")
    run.add_argument("--n-trials", type=int, help="trials the study should hold (over the whole study)")
    run.add_argument("--timeout", help="stop starting trials after this long, e.g. 8h")
    run.add_argument("--storage", help="optuna storage URL (default sqlite:///studies/<name>.db)")
    run.add_argument("--study", help="study name (default: study.name of the file)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the file")
    run.set_defaults(func=cmd_run)

    trial = sub.add_parser("trial", help="run one trial in the foreground and print its trace")
    trial.add_argument("space", help="space file; unset searched keys take their first choice")
    trial.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. --set r=64")
    trial.add_argument("--json", action="store_true", help="print the result and its attributes as JSON")
    trial.set_defaults(func=cmd_trial)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sweep``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "n_trials", None) is not None and args.n_trials < 1:
        parser.error("--n-trials must be >= 1")
    try:
        if getattr(args, "timeout", None):
            try:
                parse_duration_s(args.timeout)
            except ValueError:
                raise SpaceError(f"--timeout: {args.timeout!r} is not a duration; write e.g. 90s, 20m or 8h") from None
        return args.func(args)
    except SweeperError as exc:
        if args.debug:
            traceback.print_exc()
        for line in exc.problems:
            print(line, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("sweep: interrupted; the running trial was stopped and recorded as interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
