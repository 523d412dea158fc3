"""Real memory caps and peak measurement for the trial process.

On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction`` and the peak is
``torch.cuda.max_memory_reserved()`` (what the caching allocator held from the driver: the figure that decides OOM).
On the CPU the cap is ``RLIMIT_DATA`` (the process's private writable memory, heap and anonymous mappings, where
tensors live; it counts reserved virtual memory too, so it binds somewhat before the resident set reaches it) and the
peak is the process's peak resident set (``VmHWM``). The resident set also counts what the data segment does not (the
shared libraries' pages), so on the CPU the cap is also checked against it at the end of every training and
worst-case step (:meth:`PhasePeaks.check_cap`): a step whose resident set passed the cap ran out of memory
(:class:`CapExceeded`), as it would on a card of that size, and a trial that fit shows a peak at most the cap. On
the CPU the worker resets that peak once the model is loaded
(``/proc/self/clear_refs``), because loading dequantizes a full-precision checkpoint in host memory, which on a GPU
machine happens in host RAM, not on the card: the training-phase peak is what stands for the card. Both include the
baseline of the interpreter and its libraries (about 0.4 GiB for torch + transformers), as a real run's would.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

from sweeper.memory import GIB
from sweeper.trial._memory_phases import PhasePeakMemory

#: Substrings of allocation failures: CUDA's OutOfMemoryError, c10's CPU allocator, glibc's ENOMEM.
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")
#: oneDNN's error when it cannot create a primitive: under the CPU cap, an allocation it needed failed (its message
#: does not say so; seen in 1 of 4 runs of the edge-of-the-cap test at a step whose shape two earlier steps ran).
ONEDNN_UNDER_CAP = "could not create a primitive"


class CapExceeded(MemoryError):
    """A step of the user's run (a training or the worst-case step) held more resident memory than the CPU cap.

    ``RLIMIT_DATA`` binds the data segment, but the peak the trial reports is the resident set, which also counts the
    shared libraries' pages (about 0.5 GiB of torch's): on the demo at 2f9986b..116bb8d a batch 4 x 256 step peaked
    at 2.13 GiB under a 1.6 GiB cap and was recorded as having fit. :meth:`PhasePeaks.check_cap` raises this instead;
    it is a :class:`MemoryError`, so the trial's outcome is ``oom`` at that step.

    Args:
        peak_gib: The resident set's peak in the step's phase, GiB.
        cap_gib: The cap (``memory_limit_gib``), GiB.
    """

    def __init__(self, peak_gib: float, cap_gib: float) -> None:
        super().__init__(f"the resident set peaked at {peak_gib:.2f} GiB, over the {cap_gib:g} GiB cap")
        self.peak_gib, self.cap_gib = peak_gib, cap_gib


def set_cpu_memory_cap(limit_gib: float) -> None:
    """Cap the process's data segment (``RLIMIT_DATA``) at ``limit_gib``; allocations past it fail with ENOMEM.

    glibc's allocator is left as it is (its dynamic mmap threshold): tensors up to 32 MiB come from its heap, whose
    freed blocks stay resident within a step, so the resident peak counts them, as CUDA's ``max_memory_reserved``
    counts its caching allocator's free blocks. Pinning the threshold at 128 KiB (0505b4e) made every larger tensor its
    own mapping, zero-filled by the kernel and unmapped when freed: the demo's batch 2 x 64 trial spent 21.7 s in the
    kernel against 4.1 s without it (user 62.5 against 44.3 s, one thread), for a resident peak 0.10 GiB lower (0.857
    against 0.954 GiB).

    What the pin bought: the data segment follows the live tensors, so it meets the cap later. Which allocation meets
    the cap first decides how a trial fails: in torch, an OOM; in oneDNN, "could not create a primitive", which under
    the cap is an OOM too (:data:`ONEDNN_UNDER_CAP`); an unchecked one, a SIGSEGV, which the sweep retries as a crash.
    Measured on this project's machine (issue 53), batch 1 x 1024 of the tiny model: under 0.75 GiB after an OOM
    trial, pinned, 0 of 8 runs completed (1 SIGSEGV, 2 errors, the rest OOMs at step 3), unpinned 16 of 16
    ended as a result (OOMs at step 3, one through oneDNN); under 0.85 GiB, pinned 8 of 8 completed, unpinned 4 of 5
    completed and 1 died of SIGSEGV in a backward (pinned at 4 MiB: 2 of 10 died). A trial whose data segment comes
    within a step of the cap can die of it unpinned; the tests keep their batch-1 trials under 1 GiB, and
    ``benchmarks/speed/trial_speed.py`` measures the speed and how the edge trial ends. The lasting fix is a cap that
    binds what the peak measures: :meth:`PhasePeaks.check_cap` makes a step whose resident set passed the cap an OOM
    at the step's end, so the data segment reaches the cap only within a step that overshoots it by the shared
    libraries' share.

    Raises:
        ValueError: ``limit_gib <= 0``.
    """
    if limit_gib <= 0:
        raise ValueError(f"limit_gib must be > 0, but got {limit_gib}")
    limit = int(limit_gib * GIB)
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def lift_cpu_memory_cap() -> None:
    """Lift the cap of :func:`set_cpu_memory_cap` (back to the hard limit): once a trial has ended, writing its result
    must not fail under the trial's cap, and a warm process sets the next trial's cap itself."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def set_cuda_allocator(expandable_segments: bool) -> str:
    """Give the CUDA caching allocator the trial's ``expandable_segments`` (:attr:`sweeper.space.TrialConfig.
    expandable_segments`) before the trial allocates on the card, keeping the environment's other options (from
    ``PYTORCH_CUDA_ALLOC_CONF`` and torch's newer ``PYTORCH_ALLOC_CONF`` both, :func:`sweeper.devices.
    environment_alloc_conf`, and written to both, so that no option is dropped whichever name this torch reads); returns
    the ``PYTORCH_CUDA_ALLOC_CONF`` the trial runs under (:func:`sweeper.devices.cuda_alloc_conf`), which this
    process's environment then holds (what the trial records as ``cuda_alloc_conf``).

    The option is also set at run time (``torch._C._accelerator_setAllocatorSettings``, torch's own way to switch it,
    as its test suite does): the zygote imported torch before the trial's settings were known, and a warm trial
    process may have run a trial under the other value (which then also kept no model: the option is part of
    :func:`sweeper.trial._child.warm.model_key`, and new segments follow the new value)."""
    import os

    import torch

    from sweeper.devices import ALLOC_CONF_VAR, CUDA_ALLOC_CONF_VAR, cuda_alloc_conf, environment_alloc_conf

    conf = cuda_alloc_conf(environment_alloc_conf(), expandable_segments)
    for var in (CUDA_ALLOC_CONF_VAR, ALLOC_CONF_VAR):  # both: whichever this torch reads holds what is recorded
        if conf:
            os.environ[var] = conf
        else:
            os.environ.pop(var, None)
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    setter(f"expandable_segments:{expandable_segments}")
    return conf


def set_cuda_memory_cap(limit_gib: float, device: int = 0) -> None:
    """Cap the caching allocator of ``device`` at ``limit_gib`` (a fraction of the card's total, at most 1)."""
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * GIB / total), device)


def peak_memory_gib(device_type: str) -> float:
    """The process's peak so far in GiB: CUDA max reserved, or the CPU peak resident set since the last
    :func:`reset_cpu_peak` (``VmHWM`` of ``/proc/self/status``; ``ru_maxrss`` where there is no procfs)."""
    if device_type == "cuda":
        import torch

        return torch.cuda.max_memory_reserved() / GIB
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB


def process_memory_gib() -> dict[str, float]:
    """The process's resident set (``VmRSS``) and data segment (``VmData``, what ``RLIMIT_DATA`` counts) in GiB, from
    ``/proc/self/status``; empty where there is no procfs."""
    out = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmData:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return out


def reset_cpu_peak() -> bool:
    """Reset the process's peak resident set to its current resident set (Linux >= 4.0: ``echo 5 >
    /proc/self/clear_refs``). Returns whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a real allocation failure (``torch.OutOfMemoryError``, ``MemoryError``, allocator errors)."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, (RuntimeError, OSError)) and mentions_oom(str(exc))


def mentions_oom(text: str) -> bool:
    """Whether a message reports an allocation failure (for errors that only carry their cause as text, such as
    transformers' weight-conversion report at load time)."""
    text = text.lower()
    return any(m in text for m in _OOM_MARKERS)


def oom_cause_chain(exc: BaseException, cpu_capped: bool = False) -> Any:
    """The first exception in ``exc``'s cause/context chain that :func:`is_oom` accepts, or None. With
    ``cpu_capped`` (the process runs under :func:`set_cpu_memory_cap`) also a ``RuntimeError`` naming
    :data:`ONEDNN_UNDER_CAP`: oneDNN reports the allocations it cannot make only so."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_oom(exc) or (cpu_capped and isinstance(exc, RuntimeError) and ONEDNN_UNDER_CAP in str(exc)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


#: The phases of a trial whose peaks are recorded apart (``phase_peak_memory_gib``): loading; the training steps
#: (the constant phase's); the worst-case step (one step of the data's longest rows,
#: :class:`sweeper.trial._child.instruments.worst_case.WorstCase`); the probe's forwards; the stress phase's steps. Only
#: ``train`` and ``worst_case`` are steps the user's run takes: the trial's ``peak_memory_gib`` is their maximum.
MEMORY_PHASES = PhasePeakMemory.phases()
#: The probe's phase: entering or leaving it keeps the allocator's cache (:class:`PhasePeaks`).
PROBE_PHASE = "probe"
#: The phases whose peak is the user's run's: the judged ``peak_memory_gib`` is their maximum.
JUDGED_PHASES = PhasePeakMemory.JUDGED


class PhasePeaks:
    """The peak memory of each phase of a trial (:data:`MEMORY_PHASES`), read apart: entering a phase closes the one
    before (its peak so far is kept, the maximum over its visits), hands back what the process cached (CUDA's
    caching allocator, glibc's free heap: :func:`~sweeper.trial._child.warm.release_memory`'s work, without the
    garbage collection) and restarts the peak statistics from what the process holds now, so that the memory one
    phase freed but kept cached is not read as the next phase's. Readings are ``max_memory_reserved`` on CUDA and the
    resident set's high-water mark (``VmHWM``) on the CPU, in GiB (:func:`peak_memory_gib`).

    Into and out of the probe the cache is kept (only the statistics restart): the probe runs every few steps, and
    each hand-back made the next step fault its whole working set in again (the demo's trial #2: 16 probes, about 5%
    of its constant and stress phases, issue 53). The probe's forward needs less than the training step around it,
    whose cache it reuses, so the steps' peaks are the same; the probe's own reading is then the larger of what it
    needs and what the steps before it left cached: it says whether the probe needs more than training, not how much
    it needs alone.

    Args:
        device_type: ``cuda`` or ``cpu``.
        cap_gib: On the CPU, the cap (``memory_limit_gib``) that :meth:`check_cap` holds the judged phases' resident
            set to; None for none (CUDA's allocator cap binds its own reading).

    Attributes:
        peaks: Peak in GiB by phase, for the phases entered so far (the current one once it is closed).
        allocated: On CUDA, ``max_memory_allocated`` in GiB by phase (what the tensors held, where ``peaks`` is
            what the caching allocator reserved); empty on the CPU.
        current: The phase being measured, None between phases.
    """

    def __init__(self, device_type: str, cap_gib: float | None = None) -> None:
        self.device_type = device_type
        self.cap_gib = cap_gib if device_type == "cpu" else None
        self.peaks: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.current: str | None = None

    def check_cap(self) -> None:
        """Raise :class:`CapExceeded` when the current phase is judged (:data:`JUDGED_PHASES`) and its resident set's
        peak so far passed :attr:`cap_gib`; nothing otherwise (on CUDA, without a cap, in the probe or the stress
        phase). Reads ``/proc/self/status`` once (microseconds)."""
        if self.cap_gib is None or self.current not in JUDGED_PHASES:
            return
        reading = peak_memory_gib(self.device_type)
        if reading > self.cap_gib:
            raise CapExceeded(reading, self.cap_gib)

    def enter(self, phase: str) -> str | None:
        """Close the current phase and start measuring ``phase``; returns the phase it closed (to go back to).

        Raises:
            ValueError: ``phase`` is none of :data:`MEMORY_PHASES`.
        """
        if phase not in MEMORY_PHASES:
            raise ValueError(f"phase must be one of {MEMORY_PHASES}, but got {phase!r}")
        before = self.close()
        self._restart(hand_back=PROBE_PHASE not in (phase, before))
        self.current = phase
        return before

    def close(self) -> str | None:
        """Read the current phase's peak into :attr:`peaks` and stop measuring; returns the phase closed."""
        phase, self.current = self.current, None
        if phase is not None:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak_memory_gib(self.device_type))
            if self.device_type == "cuda":
                import torch

                allocated = torch.cuda.max_memory_allocated() / GIB
                self.allocated[phase] = max(self.allocated.get(phase, 0.0), allocated)
        return phase

    def judged_gib(self) -> float | None:
        """The largest peak of :data:`JUDGED_PHASES` measured, None when none was."""
        judged = [self.peaks[p] for p in JUDGED_PHASES if p in self.peaks]
        return max(judged) if judged else None

    def judged_allocated_gib(self) -> float | None:
        """On CUDA, the largest ``max_memory_allocated`` of :data:`JUDGED_PHASES` measured; None on the CPU or
        when none was measured."""
        judged = [self.allocated[p] for p in JUDGED_PHASES if p in self.allocated]
        return max(judged) if judged else None

    def judged_so_far_gib(self, reading_gib: float) -> float:
        """The judged peak so far (:meth:`judged_gib`), with ``reading_gib`` (the current phase's peak so far, GiB)
        when the current phase is judged; ``reading_gib`` itself before any judged phase was measured."""
        judged = [self.peaks[p] for p in JUDGED_PHASES if p in self.peaks]
        if self.current in JUDGED_PHASES or not judged:
            judged.append(reading_gib)
        return max(judged)

    def _restart(self, hand_back: bool) -> None:
        if self.device_type == "cuda":
            import torch

            if hand_back:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return
        if hand_back:
            try:
                import ctypes

                ctypes.CDLL(None).malloc_trim(0)
            except (OSError, AttributeError):
                pass
        reset_cpu_peak()
