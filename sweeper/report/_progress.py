"""Live progress of a sweep, a trial or a confirmation: what each running trial is doing (its phase, step, last loss,
peak memory so far and time) and, for a sweep, the trials finished of ``n_trials``, the time per trial so far and an
ETA bounded by the study's ``timeout``.

On a terminal it is a tqdm display: one bar for the sweep and one line per worker slot, redrawn in place, with the
trial lines printed above it (``tqdm.write``). tqdm rather than rich because it is what the field's tools already
show for the same thing (``optuna.Study.optimize(show_progress_bar=True)``, the ``transformers.Trainer``), and it is
already installed with them. Without a terminal (``nohup sweep run ... > night.log``) nothing is redrawn: the trial
lines are printed as they are, and one ``progress`` line at most every :data:`LOG_INTERVAL_S` seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from sweeper.trial import TrialProgress

#: Seconds between two ``progress`` lines when the output is not a terminal (``SWEEPER_PROGRESS_INTERVAL_S``
#: overrides it).
LOG_INTERVAL_S = 60.0


def progress_interval_s() -> float:
    """Seconds between two ``progress`` lines in a log: ``SWEEPER_PROGRESS_INTERVAL_S`` (0 to 86400), or
    :data:`LOG_INTERVAL_S` when it is unset or empty.

    Raises:
        StudyError: The variable is set to anything else (one line; a typo is never ignored).
    """
    import math

    from sweeper.errors import StudyError

    raw = os.environ.get("SWEEPER_PROGRESS_INTERVAL_S", "")
    if not raw.strip():
        return LOG_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 86400:
        raise StudyError(
            f"SWEEPER_PROGRESS_INTERVAL_S: {raw[:40]!r} is not a number of seconds from 0 to 86400; unset it "
            f"({LOG_INTERVAL_S:g} s) or give e.g. 60"
        )
    return value


_PHASES = {"load": "loading", "train": "train", "stress": "stability", "confirm": "confirm"}


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``: a duration as a person reads it."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min"


@dataclass
class _Slot:
    number: int
    label: str
    start: float
    progress: TrialProgress | None = None


def describe_running(slot: _Slot, now: float) -> str:
    """``#4 train 7/12 loss 2.31 peak 0.85 GiB 35 s``: one running trial as its last progress report says."""
    p = slot.progress if slot.progress is not None else TrialProgress(phase="load")
    phase = _PHASES.get(p.phase, p.phase)
    if slot.label == "confirm" and phase == "train":
        phase = "confirm"
    parts = [f"#{slot.number}", phase]
    if p.step is not None and p.of is not None:
        parts.append(f"{p.step}/{p.of}")
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4g}")
    if p.peak_memory_gib is not None:
        parts.append(f"peak {p.peak_memory_gib:.2f} GiB")
    parts.append(format_duration(now - slot.start))
    return " ".join(parts)


class LiveProgress:
    """The progress display (see the module docstring). Thread-safe: worker slots report from their threads.

    Args:
        total: Trials to reach (a sweep's ``n_trials``; 1 for ``sweep trial``, the trials to confirm for ``sweep
            confirm``).
        done: Trials already finished when it starts (a resumed study's).
        timeout_s: The run's time budget in seconds (bounds the ETA), or None.
        slots: Worker slots (one line each on a terminal).
        stream: Where it writes (default ``sys.stdout``); a terminal when its ``isatty()`` says so.
        interval_s: Seconds between ``progress`` lines without a terminal (default :data:`LOG_INTERVAL_S`).
        label: What the bar counts (``trials``, ``confirmations``).
    """

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        timeout_s: float | None = None,
        slots: int = 1,
        stream: IO[str] | None = None,
        interval_s: float | None = None,
        label: str = "trials",
    ):
        self.total, self.done, self.done_before, self.timeout_s = total, done, done, timeout_s
        self.stream = stream if stream is not None else sys.stdout
        self.interval_s = progress_interval_s() if interval_s is None else interval_s
        self.label = label
        self.start = time.monotonic()
        self.last_line = self.start
        self.last_finish = self.start
        self.running: dict[int, _Slot] = {}
        self.lock = threading.RLock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bars: list[Any] = []
        if self.tty:
            from tqdm import tqdm

            # The summary travels in tqdm's ``unit`` field: its ``postfix`` would be shown after a comma. It comes
            # before the bar, which takes what width is left: at 60 columns the ETA still shows. ``dynamic_ncols``
            # reads the width at each redraw and trims every line to it, so a terminal made narrower mid-run never
            # wraps a line (a wrapped line is left behind by the next redraw).
            fmt = "{desc} {n_fmt}/{total_fmt} {unit} |{bar}|"
            self.bars.append(
                tqdm(
                    total=total,
                    initial=done,
                    desc=label,
                    unit="",
                    file=self.stream,
                    bar_format=fmt,
                    leave=True,
                    dynamic_ncols=True,
                )
            )
            for i in range(slots):
                self.bars.append(
                    tqdm(
                        total=0,
                        desc=f"  slot {i}: idle",
                        file=self.stream,
                        bar_format="{desc}",
                        position=i + 1,
                        leave=False,
                        dynamic_ncols=True,
                    )
                )
        # Redraw the elapsed times (and write a log's progress line) while no report comes, e.g. while a large
        # model loads.
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="sweeper-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self.lock:
                for slot in list(self.running) or [0]:
                    self._refresh(slot)

    # -- what happens --------------------------------------------------------------------------------------------

    def line(self, text: str) -> None:
        """Print ``text`` as a line of its own (above the live display on a terminal)."""
        with self.lock:
            if self.tty:
                from tqdm import tqdm

                tqdm.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)

    def begin(self, slot: int, number: int, label: str = "trial") -> None:
        """Trial ``number`` started in ``slot`` (``label``: ``trial`` or ``confirm``)."""
        with self.lock:
            self.running[slot] = _Slot(number=number, label=label, start=time.monotonic())
            self._refresh(slot)

    def report(self, slot: int, progress: TrialProgress) -> None:
        """The running trial of ``slot`` sent a progress report (:meth:`sweeper.trial.TrialProcess.run`)."""
        with self.lock:
            if slot in self.running:
                self.running[slot].progress = progress
                self._refresh(slot)

    def end(self, slot: int, *, finished: int | None = None) -> None:
        """The trial of ``slot`` ended; ``finished``: the trials finished now (default: one more)."""
        with self.lock:
            self.running.pop(slot, None)
            self.done = finished if finished is not None else self.done + 1
            self.last_finish = time.monotonic()
            self._refresh(slot)

    def end_trial(self, number: int, *, finished: int | None = None) -> None:
        """:meth:`end` for the slot running trial ``number`` (the counts only when none does: a repeat or a
        preflight prune ran nothing)."""
        with self.lock:
            slot = next((i for i, s in self.running.items() if s.number == number), None)
            if slot is None:
                self.done = finished if finished is not None else self.done + 1
                if self.tty:
                    self._refresh(0)
                return
            self.end(slot, finished=finished)

    def close(self) -> None:
        """End the live display (the trial lines stay)."""
        self._stop.set()
        with self.lock:
            for bar in reversed(self.bars):
                bar.close()
            self.bars = []

    # -- what is shown ---------------------------------------------------------------------------------------------

    def summary(self, now: float | None = None) -> str:
        """``3/10 trials · 42 s per trial · ETA 5 min``: the counts, the time per trial this run (its wall time up to
        its last finished trial over the trials it finished, so several workers divide it) and the time left at that
        rate from the last finish, bounded by the timeout (``ETA 7 min (the timeout)``)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        parts = [f"{self.done}/{self.total} {self.label}"]
        if self.running:
            parts.append(f"{len(self.running)} running")
        finished_here = self.done - self.done_before
        if finished_here > 0:
            per = (self.last_finish - self.start) / finished_here
            left = max(0.0, max(0, self.total - self.done) * per - (now - self.last_finish))
            parts.append(f"{format_duration(per)} per trial")
            if self.timeout_s is not None and elapsed + left > self.timeout_s:
                parts.append(f"ETA {format_duration(self.timeout_s - elapsed)} (the timeout)")
            elif self.done < self.total:
                parts.append(f"ETA {format_duration(left)}")
        elif self.timeout_s is not None:
            parts.append(f"timeout in {format_duration(self.timeout_s - elapsed)}")
        return " · ".join(parts)

    def _refresh(self, slot: int) -> None:
        now = time.monotonic()
        if self.tty:
            self.bars[0].n = self.done
            summary = self.summary(now).split(" · ", 1)
            self.bars[0].unit = summary[1] if len(summary) > 1 else ""
            self.bars[0].refresh()
            if slot + 1 < len(self.bars):
                running = self.running.get(slot)
                shown = describe_running(running, now) if running is not None else "idle"
                self.bars[slot + 1].set_description_str(f"  slot {slot}: {shown}")
            return
        if self.running and now - self.last_line >= self.interval_s:
            self.last_line = now
            trials = "; ".join(describe_running(s, now) for _, s in sorted(self.running.items()))
            print(f"progress {self.summary(now)}; running {trials}", file=self.stream, flush=True)
