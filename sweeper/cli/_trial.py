"""``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time

from sweeper.cli._common import _describe_setup, _dropped_rows_line, _load, _prepare, _print
from sweeper.errors import SpaceError


def cmd_trial(args: argparse.Namespace) -> int:
    """``sweep trial SPACE.yaml --set key=value``: one trial in the foreground, its trace, and optionally JSON."""
    from sweeper.report import LiveProgress, format_instability, format_params, format_trace, margin_line
    from sweeper.study import STUDIES_DIR, check_setup
    from sweeper.trial import run_trial

    space = _load(args)
    config = space.trial_config(space.first_choices())
    model_path, samples = _prepare(space.dataset, space.model)
    setup = check_setup(space, model_path)  # what would fail the trial before it trains: one line each, exit 2
    if setup:
        raise SpaceError(setup)
    folder = STUDIES_DIR / space.study.name / "manual" / time.strftime("%Y%m%d-%H%M%S")
    if not args.json:
        shown = (
            "r",
            "lora_alpha_ratio",
            "bnb_4bit_compute_dtype",
            "bnb_4bit_use_double_quant",
            "bnb_4bit_quant_type",
            "per_device_train_batch_size",
            "max_seq_length",
            "learning_rate",
        )
        _print(f"sweep trial: {format_params({k: getattr(config, k) for k in shown})}")
        _print(_describe_setup(space, model_path, len(samples)))
        _print(f"files   {folder}")
    dropped = _dropped_rows_line(space, model_path, samples)
    if dropped and args.json:  # stdout stays one JSON document
        print(dropped, file=sys.stderr)
    elif dropped:
        _print(dropped)
    # The live display goes where the lines go; with --json, stdout is one JSON document: the display goes to stderr.
    live = LiveProgress(1, stream=sys.stderr if args.json else sys.stdout)
    live.begin(0, 0)
    try:
        result = run_trial(config, folder, model_path=model_path, on_progress=lambda progress: live.report(0, progress))
    finally:
        live.close()
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
        _print(
            f"nan     cause {result.nan_cause or 'unknown'}{module}; {which}: "
            f"{', '.join(map(str, result.nan_samples)) or '-'}; the step's rows are in {folder / 'nan_batch.jsonl'}"
        )
    if result.longest_sample_tokens is not None:
        _print(
            f"data    samples trained on: the longest has {result.longest_sample_tokens} tokens before truncation "
            f"(sample {result.longest_sample_index}); {100 * (result.truncated_sample_fraction or 0):.0f}% were cut at "
            f"max_seq_length={config.max_seq_length}; fewest supervised tokens in a step: "
            f"{result.min_supervised_tokens}"
        )
    if result.peak_memory_gib is not None:
        load = f", {result.load_peak_memory_gib:.3f} GiB while loading" if result.load_peak_memory_gib else ""
        _print(f"memory  {result.peak_memory_gib:.3f} GiB ({result.memory_kind}{load})")
    if result.instability is not None:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in result.instability_components.items())
        _print(f"instability {format_instability(result.instability)} ({parts})")
    if result.stress_stop is not None:
        _print(margin_line(result))
    times = [
        f"{k.removesuffix('_time_s')} {getattr(result, k):.1f} s"
        for k in ("import_time_s", "load_time_s", "train_time_s")
        if getattr(result, k) is not None
    ]
    if result.wall_time_s is not None:
        times.append(f"total {result.wall_time_s:.1f} s")
    _print("time    " + ", ".join(times))
    return 0
