"""What live progress costs a trial: the time of one progress report in the trial process
(:meth:`sweeper.trial._child.progress.ProgressSender.report`: a read of the peak memory, a
:class:`~sweeper.trial._job.TrialProgress` line and one write on the control pipe), against
the time of a training step. Prints both and their ratio at one report per step (the throttle sends at most two a
second, so a real trial pays less).

    python benchmarks/speed/progress_overhead.py [--reports 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

from sweeper.benchmarking import ProgressSender


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=20000)
    args = parser.parse_args()
    read_fd, write_fd = os.pipe()
    drained = threading.Event()

    def drain() -> None:  # the sweep's side: TrialProcess reads the pipe as lines come
        while os.read(read_fd, 65536):
            pass
        drained.set()

    threading.Thread(target=drain, daemon=True).start()
    progress = ProgressSender(write_fd, min_interval_s=0.0)  # every call sends: the worst case
    start = time.perf_counter()
    for step in range(args.reports):
        progress.report("train", step=step, of=args.reports, loss=2.5)
    per_report_us = (time.perf_counter() - start) / args.reports * 1e6
    os.close(write_fd)
    drained.wait(5)
    print(f"progress report: {per_report_us:.1f} us each ({args.reports} reports, every one sent)")
    for step_ms in (10.0, 100.0, 1000.0):  # a fast GPU step, a tiny-model CPU step, a built-in-model CPU step
        print(f"  for a {step_ms:g} ms step: {100 * per_report_us / 1000 / step_ms:.3f}% at one report a step")


if __name__ == "__main__":
    main()
