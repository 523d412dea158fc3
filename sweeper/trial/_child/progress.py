"""What a trial process tells its sweep while a trial runs (:class:`ProgressSender`): its phase, step, last loss and
peak memory so far, as :class:`~sweeper.trial._job.TrialProgress` lines on the control pipe (``SWEEPER_CONTROL_FD``),
the pipe its :class:`~sweeper.trial._job.TrialDone` line also travels on.

A line costs one ``os.write`` of about 100 bytes and one read of ``/proc/self/status`` (CPU) or of the CUDA
allocator's counters; lines within :data:`MIN_INTERVAL_S` of the last are skipped (a phase change is always sent), so
a trial sends at most a few lines a second whatever its step time (``benchmarks/speed/progress_overhead.py``
measures the cost). The parent side reads them as they come (:class:`sweeper.trial.TrialProcess`), so the pipe never
fills.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from sweeper.trial._child.memory import peak_memory_gib
from sweeper.trial._job import ProgressPhase, TrialProgress

#: Progress lines closer together than this are skipped, unless the phase changed (seconds).
MIN_INTERVAL_S = 0.5


class ProgressSender:
    """The progress lines of one trial process.

    Args:
        fd: The control pipe's descriptor in a trial process served by a sweep; None when the worker runs on its own
            (nothing is sent).
        device_type: ``cpu`` or ``cuda``: whose peak memory the lines carry (:meth:`set_device` changes it).
        min_interval_s: Lines closer together than this are skipped unless the phase changed (seconds).
    """

    def __init__(self, fd: int | None, device_type: str = "cpu", *, min_interval_s: float = MIN_INTERVAL_S):
        self.fd, self.device_type, self.min_interval_s = fd, device_type, min_interval_s
        self._last_time, self._last_phase = 0.0, ""
        #: The trial's phase peaks once training is set up (:class:`~sweeper.trial._child.memory.PhasePeaks`): the
        #: lines then carry the judged peak so far, not the phase's own reading.
        self.peaks: Any = None

    def set_device(self, device_type: str) -> None:
        """The device whose peak memory the lines carry (``cuda`` once the trial runs on a GPU)."""
        self.device_type = device_type

    def report(
        self, phase: ProgressPhase, *, step: int | None = None, of: int | None = None, loss: float | None = None
    ) -> None:
        """Tell the sweep what the trial is doing: ``phase`` (``load``, ``train``, ``stress``), the optimizer steps of
        the phase done and its steps, the last step's loss (left out unless finite), and the peak memory so far (GiB).
        Never raises: a sweep that stopped reading ends the trial by its own means."""
        if self.fd is None:
            return
        now = time.monotonic()
        if phase == self._last_phase and now - self._last_time < self.min_interval_s:
            return
        self._last_time, self._last_phase = now, phase
        finite_loss = round(float(loss), 6) if loss is not None and math.isfinite(loss) else None
        try:
            peak = peak_memory_gib(self.device_type)
            peak = round(self.peaks.judged_so_far_gib(peak) if self.peaks is not None else peak, 4)
            line = TrialProgress(phase=phase, step=step, of=of, loss=finite_loss, peak_memory_gib=peak).to_line()
            os.write(self.fd, line)
        except (OSError, RuntimeError):
            pass
