"""How much a trial's measured peak memory and learning progress move when nothing but the seed changes: the noise
the picks treat as a tie on memory (``MEMORY_NOISE_SHARE`` in ``sweeper/study/_objectives.py``) and the
``learning_progress`` objective's interval (``LEARNING_PROGRESS_NOISE`` in ``sweeper/stability.py``).

Runs the sweep's trial (constant phase only: the stress phase enters neither figure) of a few configurations of the
built-in model at the QLoRA recipe's rate, at ``--seeds`` seeds (``seed``: LoRA's initialisation and the data order),
each in a fresh trial process as ``sweep run`` runs a cold trial, and prints per configuration the peaks and their
spread (max over min, minus 1) and the learning progress and its standard deviation over seeds, then the largest
spread and the pooled standard deviation. Results go to ``benchmarks/stability/results/seed_noise.json``.

    python benchmarks/stability/seed_noise.py --seeds 3 --steps 12

On the CPU the peak is the process's peak RSS; on CUDA the caching allocator's peak reserved memory. Run nothing else
that allocates much beside it on the CPU (other processes do not enter a process's RSS, but swapping would).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common

sys.path.insert(0, str(Path(__file__).parent))

from validity import BASE

from sweeper.model import resolve_model

#: What differs from the validity benchmark's base (r 8, bfloat16, nf4, double quant, batch 1, 64 tokens) in each
#: configuration measured: float32 compute (on a CPU without AVX512-BF16 a bfloat16 step is 7x slower), a larger
#: batch and a longer sequence (the peak then holds more activations).
CASES: dict[str, dict[str, object]] = {
    "float32, batch 1, 64 tokens": {"bnb_4bit_compute_dtype": "float32"},
    "float32, batch 2, 128 tokens": {
        "bnb_4bit_compute_dtype": "float32",
        "per_device_train_batch_size": 2,
        "max_seq_length": 128,
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    model = resolve_model(BASE.model)
    work = Path(tempfile.mkdtemp(prefix="memory-noise-"))
    rows: dict[str, dict[str, object]] = {}
    for name, change in CASES.items():
        peaks: list[float] = []
        progress: list[float] = []
        for seed in range(args.seeds):
            config = replace(BASE, max_steps=args.steps, learning_rate=2e-4, seed=seed, **change)  # type: ignore[arg-type]
            result = _common.run_trial(config, work / f"{len(rows)}-{seed}", model_path=model, stress=False)
            peak, learned = result.memory.peak_memory_gib, result.constant.learning_progress
            print(f"{name} seed {seed}: {result.status}, peak {peak} GiB ({result.memory.memory_kind}), learning "
                  f"progress {learned}", flush=True)  # fmt: skip
            if peak is not None:
                peaks.append(peak)
            if learned is not None:
                progress.append(learned)
        spread = max(peaks) / min(peaks) - 1 if peaks else None
        sd = statistics.stdev(progress) if len(progress) >= 2 else None
        rows[name] = {"peaks_gib": peaks, "spread": spread, "learning_progress": progress, "learning_progress_sd": sd}
        print(f"{name}: peak spread {spread}, learning progress sd {sd}", flush=True)
    spreads = [r["spread"] for r in rows.values() if isinstance(r["spread"], float)]
    sds = [r["learning_progress_sd"] for r in rows.values() if isinstance(r["learning_progress_sd"], float)]
    summary = {
        "seeds": args.seeds,
        "steps": args.steps,
        "largest_peak_spread": max(spreads) if spreads else None,
        "pooled_learning_progress_sd": math.sqrt(statistics.fmean(s * s for s in sds)) if sds else None,
    }
    print(json.dumps(summary))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seed_noise.json").write_text(json.dumps({"summary": summary, "cases": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
