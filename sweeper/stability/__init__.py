"""The stability science: numbers, no text (how they are written is :mod:`sweeper.notation`). One module per measure:

- :mod:`~sweeper.stability._instability`: the probe, the instability and its terms, the divergence rule;
- :mod:`~sweeper.stability._margin`: the stress phase, the stability margin, ``predicted_max_lr`` and its calibration;
- :mod:`~sweeper.stability._chance`: the chance of diverging within the run, its call, the edge and the safe rate;
- :mod:`~sweeper.stability._headroom`: how many times its own rate a long run is predicted to hold;
- :mod:`~sweeper.stability._progress`: how much a short trial learned, its noise, and when it barely learns;
- :mod:`~sweeper.stability._figures`: the figures every view holds (:class:`StabilityFigures`).

Pure (no torch import): it runs on the JSON trace a trial process returns, so it tests in milliseconds on synthetic
traces and can be recomputed for stored trials. :mod:`sweeper.stability.experimental` holds what is measured
but not promised (the critical learning rate).
"""

from sweeper.stability._chance import (
    DEFAULT_HORIZON_STEPS,
    refit_mu,
)
from sweeper.stability._figures import (
    StabilityFigures,
)
from sweeper.stability._headroom import (
    Headroom,
    headroom_of,
)
from sweeper.stability._instability import (
    DTYPE_MAX,
    PROBE_ROWS,
    RECORDED_COMPONENTS,
    STORED_COMPONENTS,
    Divergence,
    InstabilityComponents,
    compute_instability,
    divergence,
    probe_interval_steps,
    projected_fail_step,
)
from sweeper.stability._margin import (
    DEFAULT_LR_CALIBRATION,
    STRESS_GROWTH,
    STRESS_STEPS,
    LrCalibration,
    derive_margin_figures,
    edge_proximity,
    lr_calibration_of,
    margin_interval,
    margin_of,
    stress_lr,
)
from sweeper.stability._progress import (
    SLOW_LEARNING_SHARE,
    barely_learns,
    learning_progress,
    learning_progress_noise,
)

__all__ = [
    "DEFAULT_HORIZON_STEPS",
    "DEFAULT_LR_CALIBRATION",
    "DTYPE_MAX",
    "PROBE_ROWS",
    "RECORDED_COMPONENTS",
    "SLOW_LEARNING_SHARE",
    "STORED_COMPONENTS",
    "STRESS_GROWTH",
    "STRESS_STEPS",
    "Divergence",
    "Headroom",
    "InstabilityComponents",
    "LrCalibration",
    "StabilityFigures",
    "barely_learns",
    "compute_instability",
    "derive_margin_figures",
    "divergence",
    "edge_proximity",
    "headroom_of",
    "learning_progress",
    "learning_progress_noise",
    "lr_calibration_of",
    "margin_interval",
    "margin_of",
    "probe_interval_steps",
    "projected_fail_step",
    "refit_mu",
    "stress_lr",
]
