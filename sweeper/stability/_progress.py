"""Learning progress: how much a short trial learned at its own rate, its seed noise, and when a trial barely
learns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sweeper.stability._headroom import headroom_of

#: A trial "barely learns" when its ``learning_progress`` is below this share of the best among the study's complete
#: trials: such a trial is never recommended as the most stable (its margin says how far it is from an edge it never
#: approaches, not that it is safe to train with).
LEARNING_PROGRESS_SHARE = 0.10


#: The ``safe`` pick leaves out trials that learn less than this share of the fastest-learning safe trial it chooses
#: among, and a ``knee`` or ``most-stable`` pick below it says so on its line: "learns less than half as fast as a
#: safe alternative" (the picks issue; at the recipe's rates the demo's knee learned 13% in 12 steps, the other end of
#: its front 36%).
SLOW_LEARNING_SHARE = 0.5


def barely_learns(progress: float | None, best: float | None) -> bool:
    """Whether a trial's ``learning_progress`` is under :data:`LEARNING_PROGRESS_SHARE` of ``best`` (the largest
    among the complete trials it is compared with), or not above 0. Measured on the built-in model at 30 steps: 0.45
    at lora_alpha/r 16 (r 16, 2e-4), 0.22 at 2, 0.09 at 0.5, 0.013 at 0.25 and 1e-4; a tenth of the best (0.045) calls
    the last one barely learning and keeps lora_alpha/r 0.5, which users run. Unknown progress is not "barely"."""
    if progress is None:
        return False
    if progress <= 0:
        return True
    return best is not None and best > 0 and progress < LEARNING_PROGRESS_SHARE * best


#: The seed noise of a short trial's ``learning_progress`` (absolute, a fraction) away from its edge: the
#: ``learning_progress`` objective's interval is ``value +/- LEARNING_PROGRESS_NOISE`` for a trial whose headroom is
#: safe. Measured by ``benchmarks/stability/seed_noise.py`` (the built-in model at 2e-4, 12 steps, 3 seeds, two
#: configurations: standard deviations 0.0008 and 0.0006, ``benchmarks/stability/results/seed_noise.json``); 0.01 leaves
#: room for other models and data, on which it is not measured.
LEARNING_PROGRESS_NOISE = 0.01

#: The same near the edge (a trial whose headroom is :attr:`Headroom.near_edge`, or whose margin was not measured):
#: the pooled standard deviation over seeds of 11 configurations at 3 seeds in
#: ``benchmarks/stability/validity_block.py``, all near their edge, where runs also unlearn (progress from -0.85 to
#: 0.41).
LEARNING_PROGRESS_NOISE_NEAR_EDGE = 0.14


def learning_progress_noise(stress: Any) -> float:
    """The seed noise of a trial's ``learning_progress`` from its stress phase's figures (any object with
    ``stability_margin``, ``lr_ceiling``, ``margin_capped`` and the ``predicted_max_lr`` fields, as
    :func:`headroom_of` reads them): :data:`LEARNING_PROGRESS_NOISE` when it is safely below its edge, else
    :data:`LEARNING_PROGRESS_NOISE_NEAR_EDGE`. The learning rate is recovered as ``lr_ceiling / stability_margin``
    (a capped phase is never near its edge)."""
    margin = getattr(stress, "stability_margin", None)
    if margin is None or not margin > 0:
        return LEARNING_PROGRESS_NOISE_NEAR_EDGE
    if getattr(stress, "margin_capped", False):
        return LEARNING_PROGRESS_NOISE
    ceiling = getattr(stress, "lr_ceiling", None)
    h = headroom_of(ceiling / margin, stress) if ceiling else None
    return LEARNING_PROGRESS_NOISE_NEAR_EDGE if h is None or h.near_edge else LEARNING_PROGRESS_NOISE


def learning_progress(probe_loss: Sequence[float | None]) -> float | None:
    """The probe loss's relative drop over the constant phase, ``(L_0 - L_end) / L_0``: how much the run learned at the
    user's learning rate (about 0 at learning rate 1e-9; negative when it got worse). None without a finite first and
    last probe."""
    finite = [x for x in probe_loss if x is not None and math.isfinite(x)]
    if len(probe_loss) < 2 or not finite or probe_loss[0] is None or probe_loss[-1] is None:
        return None
    start, end = float(probe_loss[0]), float(probe_loss[-1])
    if not (math.isfinite(start) and math.isfinite(end)) or start <= 0:
        return None
    return (start - end) / start
