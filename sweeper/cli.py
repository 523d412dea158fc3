"""The ``sweep`` command.

Exit codes (``SPEC.md``): 0 done (pruned trials are normal), 2 bad input (one line per problem: file, key, what is
wrong, the fix), 1 anything else, 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from pathlib import Path

from sweeper.config import Categorical, DatasetSpec, ModelSpec
from sweeper.errors import SpaceError, SweeperError
from sweeper.space import TRIAL_KEYS, SearchSpace, load_space, parse_duration_s


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

    from sweeper.console import format_counts, format_data_nan_summary, format_front, format_trial_line
    from sweeper.study import (
        MAX_CONSECUTIVE_DUPLICATES,
        count_finished,
        default_storage,
        nan_causes,
        open_study,
        pareto_front,
        redact_url,
        run_study,
        status_counts,
        trial_dir,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = _load(args)
    if not space.search:
        raise SpaceError(f"{args.space}: search: nothing to search (every key is fixed); give at least one key a "
                         "list or a range, or use 'sweep trial' for one configuration")
    timeout_s = parse_duration_s(args.timeout) if args.timeout is not None else None
    name = args.study or space.study.name
    storage = args.storage or space.study.storage or default_storage(name)
    n_trials = args.n_trials or space.study.n_trials
    model_path, samples = _prepare(space.dataset, space.model)
    study = open_study(space, storage, name, n_trials)  # a storage problem is one line before any output
    already = count_finished(study)
    _print(f"sweep: study '{name}' in {redact_url(storage)}, {n_trials} trials, searching {', '.join(space.search)}")
    _print(_describe_setup(space, model_path, len(samples)))
    for line in _data_warnings(space, model_path, samples):
        _print(line)
    start = time.monotonic()

    def on_trial(event) -> None:
        params = {k: event.trial.params.get(k) for k in space.search}
        line = format_trial_line(event.trial.number, params, event.result, event.finished, event.n_trials)
        if "retry_of" in event.trial.user_attrs:
            line += f"  (retry of #{event.trial.user_attrs['retry_of']}, interrupted)"
        _print(line)

    if already >= n_trials:
        _print(f"the study already holds {already} finished trials (n_trials={n_trials}): nothing to run; "
               "raise --n-trials to measure more")
    run_study(space, model_path=model_path, storage=storage, study_name=name, n_trials=n_trials,
              timeout_s=timeout_s, on_trial=on_trial, study=study)
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
    _print(f"done in {time.monotonic() - start:.0f} s; study in {redact_url(storage)}; next: 'sweep report {name}', "
           f"'sweep dashboard {name}', 'sweep export {name} --pick knee'")
    return 0


def _publish(study) -> None:
    """The front figure and failure notes for optuna-dashboard; a storage that refuses them costs only the figure."""
    from sweeper.dashboard import publish_study

    try:
        publish_study(study)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"sweep: the dashboard figure and notes were not stored ({exc})", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    """``sweep report STUDY``: the front, counts by status and NaN cause, the fit frontier; ``--json``; the HTML."""
    import optuna

    from sweeper.console import format_counts, format_front
    from sweeper.figures import write_html_report
    from sweeper.report import describe_fit, fit_map_data, picks, report_dict
    from sweeper.study import load_existing_study, nan_causes, pareto_front, status_counts, study_dir

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, _ = load_existing_study(args.study)
    html_path = Path(args.html) if args.html else study_dir(study.study_name) / "report.html"
    if html_path.suffix.lower() not in (".html", ".htm") or html_path.is_dir():
        raise SpaceError(f"{args.html}: --html: the report is an HTML file; give a path ending in .html")
    if args.json:
        _print(json.dumps(report_dict(study), indent=2))
    else:
        front = pareto_front(study)
        _print(f"study '{study.study_name}': Pareto front (peak memory vs instability), {len(front)} trials:")
        _print(format_front(front) if front else "  (no complete trial)")
        _print()
        _print("trials: " + format_counts(status_counts(study), nan_causes(study)))
        chosen = picks(study)
        if chosen:
            _print("picks   " + " · ".join(f"{k} #{n}" for k, n in chosen.items())
                   + f" (sweep export {study.study_name} --pick knee)")
        fits = describe_fit(fit_map_data(study))
        if fits:
            _print("largest max_seq_length that fit: " + ", ".join(f"batch {b}: {s}" for b, s in fits.items()))
    try:
        write_html_report(study, html_path)
    except OSError as exc:
        raise SweeperError([f"{html_path}: --html: cannot write the report ({exc.strerror}); choose a writable "
                            "path"]) from None
    if not args.json:
        _print(f"report  {html_path} (self-contained, opens offline)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``sweep export STUDY``: the chosen trial as a production config."""
    import optuna

    from sweeper.export import export_path, pick_trial, write_export
    from sweeper.study import load_existing_study, study_dir

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, _ = load_existing_study(args.study)
    trial = pick_trial(study, number=args.trial, pick=args.pick)
    if args.trial is None:
        how = f"{args.pick} of the front: trial {trial.number}"
    elif trial.number != args.trial:
        how = f"trial {args.trial}, a repeat of trial {trial.number} (its measured result)"
    else:
        how = f"trial {trial.number}"
    where = args.output or f"{study_dir(study.study_name) / 'exports'}/"
    target = export_path(where, args.format, f"trial{trial.number}-{args.format}")
    existed = {target.with_suffix(suffix) for suffix in (".py", ".json", ".yaml")} if target.parent.is_dir() else set()
    existed = {p for p in existed if p.exists()}
    files = write_export(study, trial, args.format, target)
    replaced = [f for f in files if f in existed]
    _print(f"export  {how} (peak {trial.values[0]:.3f} GiB, instability {trial.values[1]:.3f}) as {args.format}: "
           + ", ".join(str(f) for f in files) + (f" (replaced {len(replaced)} earlier file"
                                                 f"{'s' if len(replaced) > 1 else ''})" if replaced else ""))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``sweep dashboard STUDY``: optuna-dashboard on the study, with its artifacts, the front figure and notes."""
    import optuna

    from sweeper.dashboard import serve
    from sweeper.study import load_existing_study, redact_url

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not 1 <= args.port <= 65535:
        raise SpaceError(f"--port: {args.port} is not a port; give 1-65535, e.g. --port 8080")
    study, url = load_existing_study(args.study)
    _publish(study)
    _print(f"dashboard http://{args.host}:{args.port}/dashboard/ on {redact_url(url)} (Ctrl-C to stop)")
    try:
        serve(url, study.study_name, host=args.host, port=args.port)
    except KeyboardInterrupt:
        return 0
    return 0


#: ``max_seq_length`` values ``sweep doctor`` audits a bare dataset at when none is given: the usual range of QLoRA
#: fine-tuning of 7-8B models on one card.
DOCTOR_DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
#: The largest ``--max-seq-length``: the bound the space file puts on ``max_seq_length``.
MAX_AUDIT_LENGTH = int(TRIAL_KEYS["max_seq_length"].high)


def _compact_json(data: object) -> str:
    """Indented JSON with lists of numbers kept on one line (a finding's sample indices can run to thousands)."""
    text = json.dumps(data, indent=2)
    return re.sub(r"\[\s+(-?[\d.]+(?:,\s+-?[\d.]+)*)\s+\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)


def cmd_doctor(args: argparse.Namespace) -> int:
    """``sweep doctor SPACE.yaml | DATA``: audit the dataset as the trials would tokenize it; exit 1 with
    ``--strict`` when a finding would make a trial NaN."""
    from sweeper.console import format_audit

    for n in args.max_seq_length or []:
        if n < 2 or n > MAX_AUDIT_LENGTH:
            raise SpaceError(f"--max-seq-length: {n} is out of range; give a number of tokens from 2 to "
                             f"{MAX_AUDIT_LENGTH}, e.g. --max-seq-length 512 2048")
    if args.model is not None and not args.model.strip():
        raise SpaceError("--model: empty; give a model directory, .gguf file, hub id or builtin:smollm2-135m-instruct")
    if Path(args.target).suffix.lower() in (".yaml", ".yml"):
        space = load_space(args.target, args.set)
        dataset = space.dataset
        model = space.model if args.model is None else ModelSpec(name_or_path=args.model,
                                                                 trust_remote_code=space.model.trust_remote_code)
        lengths = args.max_seq_length or _searched_values(space, "max_seq_length")
    else:
        if args.set:
            raise SpaceError(f"--set: only a space file takes overrides, {args.target} is a dataset; give the "
                             "space file, or leave --set out")
        dataset = DatasetSpec(path=args.target, max_samples=10**9)  # a bare dataset: every row
        model = ModelSpec(name_or_path=args.model or ModelSpec().name_or_path)
        lengths = args.max_seq_length or list(DOCTOR_DEFAULT_LENGTHS)
    model_path, samples = _prepare(dataset, model)
    report, _ = _audit(samples, model, model_path, lengths)
    if args.json:
        _print(_compact_json(report.to_dict()))
    else:
        _print(f"sweep doctor: {dataset.path}, {report.samples} sample{'s' if report.samples != 1 else ''}, tokenized as the trials do with "
               f"{model.name_or_path}'s tokenizer" + (f" (vocabulary {report.vocab_size})" if report.vocab_size
                                                      else ""))
        _print(format_audit(report))
    return 1 if args.strict and report.nan_findings else 0


def _grid_values(space: SearchSpace, key: str) -> list:
    """A memory key's values in the estimate grid: a list's choices, a range's ends and middle, or the fixed value."""
    dim = space.search.get(key)
    if dim is None:
        return [space.fixed[key]]
    if isinstance(dim, Categorical):
        return list(dict.fromkeys(dim.choices))
    mid = (dim.low * dim.high) ** 0.5 if dim.log else (dim.low + dim.high) / 2
    values = [dim.low, mid, dim.high]
    return sorted({int(round(v)) for v in values}) if dim.is_int else values


def cmd_estimate(args: argparse.Namespace) -> int:
    """``sweep estimate SPACE.yaml``: predicted peak GPU memory of each memory-relevant point of the space, the terms
    of the largest, and the fit frontier against memory_limit_gib; no weights are loaded."""
    import itertools

    from sweeper.estimate import (
        KNOWN_SHAPES,
        MAX_POINTS,
        MEMORY_KEYS,
        ModelShape,
        estimate_memory,
        frontier,
        settings_from,
    )
    from sweeper.model import resolve_model

    space = _load(args)
    name = space.model.name_or_path
    model_path = name if name in KNOWN_SHAPES else resolve_model(space.model)
    config_json = Path(model_path) / "config.json"
    try:
        shape = (ModelShape.from_config(KNOWN_SHAPES[name]) if name in KNOWN_SHAPES
                 else ModelShape.from_dir(model_path))
    except (OSError, ValueError, KeyError) as exc:
        raise SweeperError([f"{config_json}: model.name_or_path: cannot read the model's shape ({type(exc).__name__}: "
                            f"{exc}); give a folder whose config.json has hidden_size, intermediate_size, "
                            "num_hidden_layers, num_attention_heads and vocab_size"]) from None
    keys = [k for k in MEMORY_KEYS if k in space.search]
    grid = list(itertools.islice(itertools.product(*[_grid_values(space, k) for k in keys]), MAX_POINTS))
    limit = float(space.fixed["memory_limit_gib"])
    points = []
    for combo in grid:
        params = dict(zip(keys, combo))
        values = {**space.fixed, **params}
        estimate = estimate_memory(shape, settings_from(values, space.model.attn_implementation))
        shown = {k: values[k] for k in ("per_device_train_batch_size", "max_seq_length", *keys)}
        points.append({"params": shown, "predicted_peak_gib": round(estimate.predicted_peak_gib, 3),
                       "terms_gib": {k: round(v, 4) for k, v in estimate.terms_gib.items()}})
    points.sort(key=lambda p: p["predicted_peak_gib"])
    edge = frontier(points, limit)
    if args.json:
        _print(json.dumps({"model": space.model.name_or_path, "memory_limit_gib": limit, "points": points,
                           "frontier": edge}, indent=1))
        return 0
    fits = sum(1 for p in points if p["predicted_peak_gib"] <= limit)
    _print(f"sweep estimate: {space.model.name_or_path} ({shape.num_hidden_layers} layers, hidden {shape.hidden_size}, "
           f"vocabulary {shape.vocab_size}), {len(points)} memory-relevant configurations of {space.path}; "
           f"{fits} predicted to fit memory_limit_gib={limit:g}")
    _print("predicted peak GPU memory (max_memory_reserved), GiB, lowest first:")
    from sweeper.console import format_params

    for p in points[:10] + ([] if len(points) <= 20 else [None]) + points[max(10, len(points) - 10):]:
        if p is None:
            _print("  ...")
            continue
        mark = "fits" if p["predicted_peak_gib"] <= limit else "OOM "
        _print(f"  {p['predicted_peak_gib']:7.2f}  {mark}  {format_params(p['params'])}")
    largest = points[-1]
    _print("terms of the largest (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in largest["terms_gib"].items()))
    _print(f"frontier for memory_limit_gib={limit:g}: " + ", ".join(
        f"batch {e['per_device_train_batch_size']}: " + (f"max_seq_length {e['max_seq_length']} "
                                                         f"({e['predicted_peak_gib']:.1f} GiB)"
                                                         if e["max_seq_length"] else "nothing fits") for e in edge))
    _print("a model, not a measurement: CUDA context and allocator overhead are uncalibrated constants "
           "(sweeper/estimate.py)")
    return 0


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


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (what is wrong, where to look) and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: {message}; see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sweep`` (exposed for tests and docs)."""
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
    estimate.set_defaults(func=cmd_estimate)

    report = sub.add_parser("report", help="the Pareto front and failures of a study, in the terminal and in HTML")
    report.add_argument("study", help="study name (studies/NAME.db), .db path or storage URL")
    report.add_argument("--html", metavar="PATH", help="where to write the HTML (default studies/<study>/report.html)")
    report.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
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
    except KeyboardInterrupt:
        running = args.command in ("run", "trial")
        print("sweep: interrupted" + ("; the running trial was stopped and recorded as interrupted" if running
                                      else "; files already written are complete"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
