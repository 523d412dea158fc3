"""How well the preflight's corrected memory model predicts a study's measured peaks (issue 13, part 2).

Reads a study (a name, a .db path or a storage URL, as `sweep report` does), predicts each trial's peak with the
current memory model (sweeper.memory, on the device kind the trials were measured on) and replays the sweep's
correction (sweeper.memory.fit_calibration) in trial order: after the first k measured trials (complete, nan, diverged
or oom; repeats and pruned trials left out), the correction fitted on them predicts every later complete trial.
It prints, per k, the median |error| of the raw and the corrected prediction, and which later OOM trials the
corrected preflight would have pruned without running, and which later fits it would have pruned wrongly; then the
errors the sweep itself recorded before each trial ran (`corrected_peak_gib`), when the study has them. Usage:

    .venv/bin/python benchmarks/memory/preflight_calibration.py STUDY [--model PATH] [--k 3]

Goal (issue 13): on the demo, a median error of the corrected prediction of at most 10% after 3 measured trials.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

from sweeper.benchmarking import calibration_points, estimate_memory, prediction_errors, settings_from
from sweeper.memory import ModelShape, fit_calibration, group_of, median_abs
from sweeper.study import load_existing_study, stored_trials
from sweeper.trial import TrialStatus


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("--model", help="checkpoint folder (default: the study's model_path)")
    parser.add_argument("--k", type=int, default=3, help="the number of measured trials the goal is stated at")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, _ = load_existing_study(args.study)
    model = args.model or study.user_attrs.get("model_path")
    shape = ModelShape.from_dir(model)
    measured = [
        t
        for t in stored_trials(study)
        if not t.is_repeat and t.status.fits is not None and t.config is not None and t.result.memory.peak_memory_gib
    ]
    if not measured:
        raise SystemExit(f"{args.study}: no measured trial")
    attn = measured[0].config.model.attn_implementation

    kind = measured[0].result.memory.memory_kind or "cpu_peak_rss"
    device = "cuda" if kind == "cuda_max_reserved" else "cpu"

    def predict_config(config) -> float:
        return estimate_memory(shape, settings_from(config, attn, device)).predicted_peak_gib

    def predict(t) -> float:
        return predict_config(t.config)

    print(f"study {study.study_name}: {len(measured)} measured trials, model {model}")
    print(f"{'trial':>5} {'status':>8} {'group':>18} {'predicted':>9} {'measured':>8} {'ratio':>6}  cap")
    for t in measured:
        p, m = predict(t), t.result.memory.peak_memory_gib
        print(
            f"{t.number:>5} {t.status.value:>8} {group_of(t.config):>18} {p:9.3f} {m:8.3f} "
            f"{m / p:6.2f}  {t.config.memory_limit_gib:g}"
        )
    raw_all = median_abs(
        (predict(t) - t.result.memory.peak_memory_gib) / t.result.memory.peak_memory_gib
        for t in measured
        if t.status == TrialStatus.COMPLETE
    )
    print(f"\nraw memory model: median |error| {100 * raw_all:.1f}% over the complete trials\n")
    print(f"{'k':>3} {'points':>6} {'later':>5} {'raw':>6} {'corrected':>9}  pruned OOMs / pruned fits")
    for k in range(1, len(measured)):
        seen, later = measured[:k], measured[k:]
        points = calibration_points(seen, predict_config, kind)
        fit = fit_calibration(points, kind)
        complete = [t for t in later if t.status == TrialStatus.COMPLETE]
        raw = [(predict(t) - t.result.memory.peak_memory_gib) / t.result.memory.peak_memory_gib for t in complete]
        corrected = [
            ((fit.correct(t.config, predict(t)) if fit else predict(t)) - t.result.memory.peak_memory_gib)
            / t.result.memory.peak_memory_gib
            for t in complete
        ]
        pruned_oom, pruned_fit = [], []
        for t in later:
            config = t.config
            bound = config.memory_limit_gib * (1 + config.preflight_margin)
            peak = fit.correct(config, predict(t)) if fit else predict(t)
            if peak > bound:
                (pruned_oom if t.status == TrialStatus.OOM else pruned_fit).append(t.number)
        mark = "  <- goal" if k == args.k else ""
        print(
            f"{k:>3} {len(points):>6} {len(complete):>5} {_pct(median_abs(raw)):>6} "
            f"{_pct(median_abs(corrected)):>9}  {pruned_oom or '-'} / {pruned_fit or '-'}{mark}"
        )
    # As the sweep does it: each trial predicted with the correction fitted on every complete trial before it.
    sequential = []
    for i, t in enumerate(measured):
        if i < args.k or t.status != TrialStatus.COMPLETE:
            continue
        points = calibration_points(measured[:i], predict_config, kind)
        fit = fit_calibration(points, kind)
        p, m = predict(t), t.result.memory.peak_memory_gib
        sequential.append((t.number, p, fit.correct(t.config, p) if fit else p, m))
    if sequential:
        print(
            f"\nsequential, after {args.k} measured trials (each trial predicted from all before it): median |error| "
            f"{_pct(median_abs((p - m) / m for _, p, _, m in sequential))} raw, "
            f"{_pct(median_abs((c - m) / m for _, _, c, m in sequential))} corrected over {len(sequential)} trials: "
            + ", ".join(f"#{n} {c:.2f} vs {m:.2f}" for n, _, c, m in sequential)
        )
    rows = [r for r in prediction_errors(study) if r.corrected_error is not None]
    if rows:
        raw = statistics.median(abs(r.error) for r in rows if r.error is not None)
        corrected = statistics.median(abs(r.corrected_error) for r in rows if r.corrected_error is not None)
        print(
            f"\nrecorded by the sweep before each trial ran: median |error| {100 * raw:.1f}% raw, "
            f"{100 * corrected:.1f}% corrected, over {len(rows)} trials (#{', #'.join(str(r.number) for r in rows)})"
        )
    pruned = [t for t in stored_trials(study) if t.status == TrialStatus.PREDICTED_OOM]
    for t in pruned:
        print(f"predicted_oom #{t.number}: {t.result.reason}")


if __name__ == "__main__":
    main()
