"""The ``sweep`` commands that read a dataset, a space's model or a finished study, rather than run trials:
``doctor``, ``estimate``, ``report``, ``export`` and ``dashboard``. Registered by :func:`sweeper.cli.build_parser`;
they share its helpers and error handling.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from sweeper.cli import _audit, _load, _prepare, _print, _publish, _searched_values
from sweeper.config import Categorical, DatasetSpec, ModelSpec
from sweeper.console import format_params
from sweeper.errors import SpaceError, SweeperError
from sweeper.space import TRIAL_KEYS, SearchSpace, load_space


def _study_ref(ref: str) -> str:
    """STUDY as the user gave it, fit to be shown in a hint: a URL's password redacted, quoted."""
    from sweeper.study import redact_url

    return f"'{redact_url(ref)}'" if "://" in ref else ref


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
                   + f" (sweep export {_study_ref(args.study)} --pick knee)")
        fits = describe_fit(fit_map_data(study))
        if fits:
            _print("largest max_seq_length that fit: " + ", ".join(f"batch {b}: {s}" for b, s in fits.items()))
    if args.json and not args.html:
        return 0  # JSON for a script: no file unless --html asks for one
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
    if dim.is_int:
        step = int(dim.step or 1)
        every = list(range(int(dim.low), int(dim.high) + 1, step))
        if len(every) <= 32:  # a stepped range of lengths or batch sizes: every value
            return every
        picks = [every[round(i * (len(every) - 1) / 8)] for i in range(9)]
        return sorted(set(picks))
    mid = (dim.low * dim.high) ** 0.5 if dim.log else (dim.low + dim.high) / 2
    return [dim.low, mid, dim.high]


def cmd_estimate(args: argparse.Namespace) -> int:  # noqa: C901 - one command's output, top to bottom
    """``sweep estimate SPACE.yaml``: predicted peak GPU memory of each memory-relevant point of the space, the terms
    of the largest, and the fit frontier against memory_limit_gib; no weights are loaded."""
    import itertools
    import math

    from sweeper.estimate import (
        MAX_POINTS,
        MEMORY_KEYS,
        ModelShape,
        estimate_memory,
        frontier,
        known_shape,
        settings_from,
    )
    from sweeper.model import resolve_model

    space = _load(args)
    name = space.model.name_or_path
    known = known_shape(name)
    model_path = name if known else resolve_model(space.model)
    config_json = Path(model_path) / "config.json"
    try:
        shape = ModelShape.from_config(known) if known else ModelShape.from_dir(model_path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SweeperError([f"{config_json}: model.name_or_path: cannot read the model's shape ({exc}); give a "
                            "folder whose config.json has hidden_size, intermediate_size, num_hidden_layers, "
                            "num_attention_heads and vocab_size"]) from None
    projections = shape.linear_shapes()
    targets = {m for v in _grid_values(space, "target_modules") for m in v}
    unknown = sorted(targets - set(projections))
    if unknown:
        raise SpaceError(f"{space.path}: training.target_modules: {', '.join(unknown)} is not a projection of a "
                         f"Llama-style layer; the memory model knows {', '.join(projections)}")
    keys = [k for k in MEMORY_KEYS if k in space.search]
    values = [_grid_values(space, k) for k in keys]
    size = math.prod(len(v) for v in values)
    grid = list(itertools.islice(itertools.product(*values), MAX_POINTS))
    limit = float(space.fixed["memory_limit_gib"])
    points = []
    for combo in grid:
        params = dict(zip(keys, combo))
        values = {**space.fixed, **params}
        estimate = estimate_memory(shape, settings_from(values, space.model.attn_implementation, args.device))
        shown = {k: values[k] for k in ("per_device_train_batch_size", "max_seq_length", *keys)}
        points.append({"params": shown, "predicted_peak_gib": round(estimate.predicted_peak_gib, 3),
                       "terms_gib": {k: round(v, 4) for k, v in estimate.terms_gib.items()}})
    points.sort(key=lambda p: p["predicted_peak_gib"])
    edge = frontier(points, limit)
    if args.json:
        _print(json.dumps({"model": space.model.name_or_path, "device": args.device, "memory_limit_gib": limit,
                           "points": points,
                           "frontier": edge}, indent=1))
        return 0
    fits = sum(1 for p in points if p["predicted_peak_gib"] <= limit)
    _print(f"sweep estimate: {space.model.name_or_path} ({shape.num_hidden_layers} layers, hidden {shape.hidden_size}, "
           f"vocabulary {shape.vocab_size}), {len(points)} memory-relevant configurations of {space.path}; "
           f"{fits} predicted to fit memory_limit_gib={limit:g}")
    if size > len(points):
        _print(f"WARNING the space has {size} memory-relevant configurations; only the first {len(points)} were "
               "estimated, so the frontier may miss some: fix keys with --set or narrow the lists")
    _print("predicted peak GPU memory (max_memory_reserved), GiB, lowest first:" if args.device == "cuda" else
           "predicted peak resident set of a CPU trial, GiB, lowest first (it runs 0.3-0.5 GiB under the measured "
           "peak for the built-in model):")
    for p in points[:10] + ([] if len(points) <= 20 else [None]) + points[max(10, len(points) - 10):]:
        if p is None:
            _print("  ...")
            continue
        mark = "fits" if p["predicted_peak_gib"] <= limit else "OOM "
        _print(f"  {p['predicted_peak_gib']:7.2f}  {mark}  {format_params(p['params'])}")
    largest = points[-1]
    _print("terms of the largest (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in largest["terms_gib"].items()))
    _print(f"frontier for memory_limit_gib={limit:g} (largest max_seq_length predicted to fit, at the cheapest "
           "setting of the other keys; in brackets whatever the other keys):")
    others = [k for k in keys if k not in ("per_device_train_batch_size", "max_seq_length")]
    for e in edge:
        if e["max_seq_length"] is None:
            _print(f"  batch {e['per_device_train_batch_size']}: nothing fits")
            continue
        at = format_params({k: e["params"][k] for k in others})
        every = e["max_seq_length_all_settings"]
        _print(f"  batch {e['per_device_train_batch_size']}: max_seq_length {e['max_seq_length']} "
               f"({e['predicted_peak_gib']:.1f} GiB{', at ' + at if at else ''}) "
               f"[{every if every is not None else 'none'}]")
    _print("a model, not a measurement: CUDA context and allocator overhead are uncalibrated constants "
           "(sweeper/estimate.py)")
    return 0
