"""Before a trial runs, what the study knows: each measured trial's config and whether it fit (:class:`Known`, for
the dominance rule and the preflight of :mod:`sweeper.memory`), and the device this machine's trials run on.
"""

from __future__ import annotations

from sweeper.devices import cuda_visible
from sweeper.memory import Known
from sweeper.study import StudyLike, snapshot


def trial_device() -> str:
    """``cuda`` when the trials of this machine run on a GPU, else ``cpu`` (:func:`sweeper.devices.cuda_visible`)."""
    return "cuda" if cuda_visible() else "cpu"


def known_memory(study: StudyLike, memory_kind: str | None = None) -> list[Known]:
    """What the study knows about memory: each measured trial's config, and whether it fit (complete or NaN) or ran
    out of memory (:attr:`sweeper.trial._status.TrialStatus.fits`); repeats and trials without a stored config left out.
    With ``memory_kind``, only trials measured that way (a CPU trial's OOM says nothing about a GPU's)."""
    out = []
    for t in snapshot(study).trials:
        fits = t.status.fits
        if t.is_repeat or fits is None or t.config is None or not t.state.is_finished():
            continue
        kind = t.result.memory.memory_kind
        if memory_kind is not None and kind is not None and kind != memory_kind:
            continue
        out.append(Known(number=t.number, config=t.config, fits=fits, memory_kind=kind))
    return out
