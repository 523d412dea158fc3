"""Per-trial overhead: seconds of process start, imports and model load against seconds of training.

Runs a few real trials of the demo's model (SmolLM2-135M-Instruct, built in) one after another, each in its own
worker process as `sweep run` does, and prints where the wall time goes. Usage:

    .venv/bin/python benchmarks/trial_overhead.py [--max-steps 5] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from sweeper.model import resolve_model
from sweeper.space import ModelSpec, TrialConfig
from sweeper.trial import run_trial

CONFIGS = [
    {"bnb_4bit_compute_dtype": "bfloat16", "per_device_train_batch_size": 1, "max_seq_length": 128},
    {"bnb_4bit_compute_dtype": "bfloat16", "per_device_train_batch_size": 2, "max_seq_length": 256},
    {"bnb_4bit_compute_dtype": "float32", "per_device_train_batch_size": 1, "max_seq_length": 128},
    {"bnb_4bit_compute_dtype": "float16", "per_device_train_batch_size": 1, "max_seq_length": 128},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model_path = resolve_model(ModelSpec())
    header = (
        f"{'config':<34} {'start_s':>8} {'import_s':>8} {'load_s':>8} {'train_s':>8} {'wall_s':>8} {'s/step':>7} "
        f"{'tokens/s':>9}"
    )
    print(header)
    print("-" * len(header))
    overhead, training = [], []
    for values in CONFIGS:
        rows = []
        for _ in range(args.repeats):
            config = TrialConfig(
                max_steps=args.max_steps, memory_limit_gib=20.0, r=8, learning_rate=1e-3, trial_timeout_s=900, **values
            )
            with tempfile.TemporaryDirectory() as folder:
                result = run_trial(config, folder, model_path=model_path)
            assert result.status == "complete", result.reason
            start = result.wall_time_s - result.import_time_s - result.load_time_s - result.train_time_s
            rows.append(
                (
                    start,
                    result.import_time_s,
                    result.load_time_s,
                    result.train_time_s,
                    result.wall_time_s,
                    result.tokens_per_s,
                )
            )
        med = [statistics.median(col) for col in zip(*rows)]
        overhead.append(med[0] + med[1] + med[2])
        training.append(med[3])
        name = (
            f"{values['bnb_4bit_compute_dtype']} b={values['per_device_train_batch_size']} s={values['max_seq_length']}"
        )
        print(
            f"{name:<34} {med[0]:8.1f} {med[1]:8.1f} {med[2]:8.1f} {med[3]:8.1f} {med[4]:8.1f} "
            f"{med[3] / args.max_steps:7.2f} {med[5]:9.0f}"
        )
    print(
        f"\nmedian of {args.repeats} runs each, {args.max_steps} steps; overhead (start + import + load) "
        f"{statistics.median(overhead):.1f} s per trial against {statistics.median(training):.1f} s of training"
    )


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"benchmark wall time {time.monotonic() - t0:.0f} s")
