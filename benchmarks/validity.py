"""Does a short trial's instability predict whether the long run survives? Each configuration of the built-in model
runs short (the horizon a sweep uses) and long (10x as many steps, or until it fails), through the same trial process
as ``sweep run``; the script prints and writes, per configuration, the short instability and projected failure step
against the long outcome, and overall the Spearman rank correlation, the AUC of "fails within the long run" and the
short-vs-long peak memory.

    python benchmarks/validity.py                       # 15 configurations, 30 and 300 steps: ~1.5 h on 2 cores
    python benchmarks/validity.py --short 30 --long 300 --only 0,5 --out /tmp/v

Results go to ``benchmarks/results/validity.json`` and ``validity.md`` (``--out`` to change), rewritten after every
configuration, so an interrupted run keeps what it measured; ``--resume`` skips configurations already there.

The long outcome, for the rank correlation: a run that failed (NaN or diverged) at step ``s`` of ``L`` scores
``2 + (L - s) / L`` (earlier is worse); one that completed scores its long run's instability (the probe's rebound
over the whole run, :mod:`sweeper.stability`), which is below 2 unless it came within a hair of the divergence ratio.
fp16 compute is left out: on this CPU an fp16 step is about 8x slower than bf16, and 300 of them per configuration
would take hours.

Run nothing else that trains while it runs: two torch processes on 2 cores, each with a thread per core, slow each
other down 10-40x (OpenMP threads spin while they wait; measured here: a 40-step trial took 604 s instead of 65 s).
``--threads 1`` gives each trial one thread, so the machine stays usable at about half the speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from sweeper.model import resolve_model
from sweeper.space import DatasetSpec, ModelSpec, TrialConfig
from sweeper.trial import run_trial

#: (learning_rate, lora_alpha_ratio, bnb_4bit_compute_dtype, per_device_train_batch_size): chosen to span runs that
#: learn calmly, runs that diverge only after a short trial's horizon, and runs that diverge at once.
CONFIGS = [
    (1e-4, 2.0, "bfloat16", 1),
    (3e-4, 2.0, "float32", 1),
    (1e-3, 8.0, "bfloat16", 1),
    (3e-3, 1.0, "bfloat16", 1),
    (3e-3, 8.0, "float32", 1),
    (2e-3, 16.0, "bfloat16", 1),
    (4e-3, 8.0, "bfloat16", 4),
    (5e-3, 8.0, "bfloat16", 1),
    (8e-3, 8.0, "bfloat16", 1),
    (1e-2, 8.0, "float32", 1),
    (2e-2, 8.0, "bfloat16", 1),
    (5e-2, 2.0, "bfloat16", 2),
    # More candidates for divergence after the short horizon (appended, so the indices above keep their rows).
    (4e-3, 8.0, "bfloat16", 1),
    (3e-3, 16.0, "bfloat16", 1),
    (6e-3, 4.0, "float32", 1),
]

#: Everything else, as in the issue's late-divergence space: built-in data, 64 tokens a row, 4 attention projections.
BASE = TrialConfig(
    r=8,
    bnb_4bit_compute_dtype="bfloat16",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_quant_type="nf4",
    max_seq_length=64,
    optim="paged_adamw_8bit",
    gradient_checkpointing=True,
    max_grad_norm=1.0,
    lora_dropout=0.05,
    memory_limit_gib=4.0,
    trial_timeout_s=3 * 3600.0,
    model=ModelSpec(name_or_path="builtin:smollm2-135m-instruct", attn_implementation="sdpa"),
    dataset=DatasetSpec(path="builtin:pydoc-topics", max_samples=256),
)

FAILED = ("nan", "diverged")


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan with fewer than 3 pairs or a constant side."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    if len(xs) < 3:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def auc(scores: list[float], positives: list[bool]) -> float:
    """Area under the ROC curve of ``scores`` for ``positives`` (Mann-Whitney, ties count half); nan without both."""
    pos = [s for s, p in zip(scores, positives) if p]
    neg = [s for s, p in zip(scores, positives) if not p]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def short_score(result: dict) -> float:
    """The short trial's instability, with a failure inside the short horizon as the worst score."""
    if result["status"] in FAILED:
        return math.inf
    return float(result.get("instability") or 0.0)


def long_outcome(result: dict, steps: int) -> float:
    """See the module docstring: ``2 + (L - s) / L`` for a failure at step ``s``, else the long run's instability."""
    if result["status"] in FAILED:
        return 2.0 + (steps - (result.get("fail_step") or steps)) / steps
    return float(result.get("instability") or 0.0)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def summarize(rows: list[dict], short: int, long: int) -> dict:
    """The overall figures over the finished rows."""
    done = [r for r in rows if r.get("long") and r.get("short")]
    scores = [short_score(r["short"]) for r in done]
    finite = [s if math.isfinite(s) else 1e9 for s in scores]
    outcomes = [long_outcome(r["long"], long) for r in done]
    fails = [r["long"]["status"] in FAILED for r in done]
    peaks = [
        (r["short"]["peak_memory_gib"], r["long"]["peak_memory_gib"])
        for r in done
        if r["short"].get("peak_memory_gib") and r["long"].get("peak_memory_gib")
    ]
    worst_peak = max((abs(b - a) / a for a, b in peaks), default=math.nan)
    shares = [r[k]["probe_time_share"] for r in done for k in ("short", "long") if r[k].get("probe_time_share")]
    # The harder question: among the runs the short trial saw complete, does its instability rank the ones that
    # fail later above the ones that do not?
    survivors = [(s, f) for s, f in zip(finite, fails) if s < 1e9]
    return {
        "configurations": len(done),
        "short_steps": short,
        "long_steps": long,
        "failed_long": sum(fails),
        "spearman": spearman(finite, outcomes),
        "auc_fails_within_long": auc(finite, fails),
        "auc_late_failures": auc([s for s, _ in survivors], [f for _, f in survivors]),
        "late_failures": sum(f for _, f in survivors),
        "short_survivors": len(survivors),
        "peak_memory_max_relative_difference": worst_peak,
        "probe_time_share_max": max(shares, default=math.nan),
        "probe_time_share_median": sorted(shares)[len(shares) // 2] if shares else math.nan,
    }


def markdown(rows: list[dict], summary: dict, command: str) -> str:
    """The table and the summary as markdown."""
    long = summary["long_steps"]
    lines = [
        f"`{command}`",
        "",
        "| # | learning_rate | lora_alpha/r | compute | batch | short status | short instability | projected fail "
        "step | long status | long fail step | long probe loss (start -> end) | long outcome | peak GiB short / "
        "long |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not (r.get("short") and r.get("long")):
            continue
        s, lg = r["short"], r["long"]
        probe = lg.get("probe_loss_trace") or []
        change = f"{_fmt(probe[0], '.2f')} -> {_fmt(probe[-1], '.2f')}" if probe else "-"
        lines.append(
            f"| {r['index']} | {r['learning_rate']:g} | {r['lora_alpha_ratio']:g} | {r['compute_dtype']} | "
            f"{r['batch']} | {s['status']} | {_fmt(short_score(s))} | {_fmt(s.get('projected_fail_step'), 'd')} | "
            f"{lg['status']} | {_fmt(lg.get('fail_step'), 'd') if lg['status'] in FAILED else '-'} | {change} | "
            f"{_fmt(long_outcome(lg, long))} | {_fmt(s.get('peak_memory_gib'))} / {_fmt(lg.get('peak_memory_gib'))} |"
        )
    lines += [
        "",
        f"- configurations: {summary['configurations']}, short {summary['short_steps']} steps, long "
        f"{summary['long_steps']} steps; failed within the long run: {summary['failed_long']}",
        f"- Spearman rank correlation, short instability vs long outcome: {_fmt(summary['spearman'])}",
        f'- AUC of short instability for "fails within the long run": {_fmt(summary["auc_fails_within_long"])}',
        f"- the same AUC among the {summary['short_survivors']} runs the short trial saw complete "
        f"({summary['late_failures']} of them fail later): {_fmt(summary['auc_late_failures'])}",
        "- largest short-vs-long peak memory difference: "
        f"{_fmt(100 * summary['peak_memory_max_relative_difference'], '.2f')}%",
        f"- probe time as a share of training: median {_fmt(100 * summary['probe_time_share_median'], '.1f')}%, "
        f"largest {_fmt(100 * summary['probe_time_share_max'], '.1f')}%",
    ]
    return "\n".join(lines) + "\n"


def _trimmed(result: dict) -> dict:
    keep = (
        "status",
        "reason",
        "fail_step",
        "steps_done",
        "instability",
        "instability_components",
        "peak_memory_gib",
        "probe_steps",
        "probe_loss_trace",
        "probe_time_share",
        "projected_fail_step",
        "train_time_s",
        "loss_trace",
    )
    return {k: result.get(k) for k in keep}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=30, help="steps of the short run (default 30)")
    parser.add_argument("--long", type=int, default=300, help="steps of the long run (default 300)")
    parser.add_argument("--only", help="comma-separated configuration indices")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the results")
    parser.add_argument("--resume", action="store_true", help="keep the configurations already in validity.json")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each trial (default: torch's own)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/validity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    chosen = [int(i) for i in args.only.split(",")] if args.only else list(range(len(CONFIGS)))
    existing = {}
    if args.resume and (out / "validity.json").is_file():
        existing = {r["index"]: r for r in json.loads((out / "validity.json").read_text())["rows"]}
    model_path = resolve_model(BASE.model)
    rows: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="validity-"))
    for index in chosen:
        lr, ratio, dtype, batch = CONFIGS[index]
        if index in existing and existing[index].get("long"):
            rows.append(existing[index])
            continue
        row = {"index": index, "learning_rate": lr, "lora_alpha_ratio": ratio, "compute_dtype": dtype, "batch": batch}
        config = replace(
            BASE,
            learning_rate=lr,
            lora_alpha_ratio=ratio,
            bnb_4bit_compute_dtype=dtype,
            per_device_train_batch_size=batch,
        )
        for name, steps in (("short", args.short), ("long", args.long)):
            start = time.monotonic()
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)} if args.threads else None
            result = run_trial(
                replace(config, max_steps=steps), work / f"{index}-{name}", model_path=model_path, env=env
            )
            row[name] = _trimmed(result.to_dict())
            print(
                f"#{index} lr={lr:g} alpha/r={ratio:g} {dtype} batch={batch} {name} {steps} steps: {result.status} "
                f"instability={_fmt(result.instability)} fail_step={result.fail_step} "
                f"peak={_fmt(result.peak_memory_gib)} GiB ({time.monotonic() - start:.0f} s)",
                flush=True,
            )
        rows.append(row)
        summary = summarize(rows, args.short, args.long)
        (out / "validity.json").write_text(json.dumps({"command": command, "summary": summary, "rows": rows}, indent=1))
        (out / "validity.md").write_text(markdown(rows, summary, command))
    summary = summarize(rows, args.short, args.long)
    (out / "validity.json").write_text(json.dumps({"command": command, "summary": summary, "rows": rows}, indent=1))
    (out / "validity.md").write_text(markdown(rows, summary, command))
    print(markdown(rows, summary, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
