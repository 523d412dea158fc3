"""The CUDA context a trial process holds, against what ``memory_limit_gib: auto`` keeps free for it (issue 57).

    python benchmarks/gpu/cuda_context.py [--json FILE] [--model FOLDER]

The context (torch's kernels, cuBLAS, bitsandbytes' module) lives outside the caching allocator, so outside both the
trial's cap and its measured peak; ``auto`` keeps :attr:`sweeper.trial.Card.reserve_gib` free for it. Printed, for
each visible card:

1. ``reader_context_gib``: the context of ``sweep``'s card-reading process (:func:`sweeper.trial.read_cards`: what
   the driver counted in use after it held a context with cuBLAS loaded, less before, less its allocator's reserve).
2. ``trial_context_gib``: a real trial's (``run_trial`` of the tiny Llama, 4-bit, 4 steps, on ``cuda:0``): the most
   ``nvidia-smi --query-compute-apps`` counted for the trial process while it ran, less its peak reserved memory
   (``peak_memory_gib``: what the caching allocator held at its peak; the context does not shrink while it runs).
3. ``reserve_gib``: what ``auto`` keeps free on that card, and whether it covers the trial's context.

Without a CUDA device or ``nvidia-smi`` it says so and exits 0 (the GPU check's dry run on the CPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common

from sweeper.memory import GIB


def used_by_pid() -> dict[int, int]:
    """What the driver counts in use by each compute process, in bytes (``nvidia-smi --query-compute-apps``); {}
    where it cannot be run or lists no process (inside some containers it lists none)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    used = {}
    for line in done.stdout.splitlines():
        pid, _, mib = line.partition(",")
        try:
            used[int(pid)] = int(mib) * 2**20
        except ValueError:
            continue
    return used


def trial_context_gib(model: Path, work: Path) -> dict:
    """Run one real trial on ``cuda:0`` while polling its process's use; its context in GiB, with the figures."""
    from sweeper.testing import tiny_trial_config

    pid: list[int] = []
    most = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.2):
            if pid:
                most[0] = max(most[0], used_by_pid().get(pid[0], 0))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    config = tiny_trial_config(model, max_steps=4, memory_limit_gib=8.0, trial_timeout_s=300.0)
    try:
        result = _common.run_trial(config, work / "trial", model_path=str(model), on_start=pid.append, stress=False)
    finally:
        done.set()
        watcher.join()
    peak = result.memory.peak_memory_gib
    seen = most[0] / GIB if most[0] else None
    return {
        "status": result.status,
        "process_used_gib": seen,
        "peak_reserved_gib": peak,
        "trial_context_gib": None if seen is None or peak is None else seen - peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--model", type=Path, help="a tiny checkpoint folder (default: built here)")
    args = parser.parse_args()
    from sweeper.devices import CardError, cuda_visible, read_cards

    if not cuda_visible() or shutil.which("nvidia-smi") is None:
        print("cuda_context: no CUDA device or no nvidia-smi here: nothing to measure (the dry run on the CPU)")
        return
    try:
        cards = read_cards("cuda")
    except CardError as exc:
        print(f"cuda_context: {exc}")
        return
    figures: dict = {
        "cards": [
            {"name": c.name, "total_memory_gib": c.total_memory_gib, "reader_context_gib": c.context_gib,
             "reserve_gib": c.reserve_gib}
            for c in cards
        ]
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from sweeper.testing import build_tiny_model

            model = build_tiny_model(Path(tmp) / "tiny")
        figures["trial"] = trial_context_gib(model, Path(tmp))
    for card in figures["cards"]:
        reader = card["reader_context_gib"]
        print(
            f"{card['name']}: {card['total_memory_gib']:.2f} GiB; the card reader's context "
            f"{'not read' if reader is None else f'{reader:.3f} GiB'}; auto keeps {card['reserve_gib']:.2f} GiB free"
        )
    t = figures["trial"]
    context = t["trial_context_gib"]
    if context is None:
        print(f"trial ({t['status']}): nvidia-smi listed no use by its process: its context not read")
    else:
        covered = "covers it" if context <= figures["cards"][0]["reserve_gib"] else "DOES NOT cover it"
        print(
            f"trial ({t['status']}) on cuda:0: its process used at most {t['process_used_gib']:.3f} GiB, its peak "
            f"reserved {t['peak_reserved_gib']:.3f} GiB: context {context:.3f} GiB; auto's reserve {covered}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
