"""Each phase's peak memory and the cap (child side): :class:`PhaseMemory` measures the phases of a trial apart
(:class:`~sweeper.trial._child.memory.PhasePeaks`: ``load``, ``train``, ``worst_case``, ``probe``, ``stress``), holds
a CPU trial's judged phases to the cap at each constant-phase step's end (as a card's allocator would), and writes
the result's memory readings.
"""

from __future__ import annotations

from sweeper.space import TrialConfig
from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.memory import PhasePeaks
from sweeper.trial._memory_phases import PhasePeakMemory
from sweeper.trial._result import TrialResult


class PhaseMemory(Instrument):
    """Phase peaks and the CPU cap (always on). Armed by the recipe once loading ended
    (:meth:`start`: the ``load`` phase's peak is the loading's); the other instruments enter their phases through
    the record (:meth:`~sweeper.trial._child.record.TrainingRecord.enter_memory_phase`).

    Writes ``phase_peak_memory_gib``, ``stress_peak_memory_gib``, ``peak_memory_gib`` (the judged phases' largest)
    and ``peak_allocated_gib``."""

    name = "phase_memory"

    def arm(self, arming: Arming) -> int:
        """Keep the record and the trial's cap."""
        super().arm(arming)
        self.cap_gib = arming.trial.config.memory_limit_gib
        return 0

    def start(self, device_type: str, load_peak_gib: float) -> None:
        """Start the phase peaks, with ``load_peak_gib`` (GiB) as the ``load`` phase's."""
        peaks = PhasePeaks(device_type, cap_gib=self.cap_gib)
        peaks.peaks["load"] = load_peak_gib
        self.record.peaks = peaks

    def on_step_end(self, args, state, control, **kwargs):
        """A constant-phase step whose resident set passed the CPU cap raises
        :class:`~sweeper.trial._child.memory.CapExceeded` (an OOM at that step)."""
        record = self.record
        if not record.stressing and record.peaks is not None:
            record.peaks.check_cap()

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """The phases' peaks and the judged peak (nothing before the peaks started: loading failed)."""
        peaks = self.record.peaks if self.record is not None else None
        if peaks is None:
            return
        peaks.close()
        result.memory.phase_peak_memory_gib = PhasePeakMemory.of(peaks.peaks)
        result.memory.stress_peak_memory_gib = peaks.peaks.get("stress")
        result.memory.peak_memory_gib = peaks.judged_gib()
        result.memory.peak_allocated_gib = peaks.judged_allocated_gib()
