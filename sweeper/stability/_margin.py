"""The stability margin: how far a configuration is from its divergence edge, from the stress phase after its
constant phase (an LR range test); ``predicted_max_lr`` and its calibration."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sweeper.stability._chance import DEFAULT_HORIZON_STEPS, DIVERGENCE_MODEL, DivergenceModel, divergence_chance

# -----------------------------------------

#: Stress phase (an LR range test after the constant phase: Smith 2017, "Cyclical Learning Rates for Training Neural
#: Networks", sec. 3.3; fastai's ``lr_find``, Lightning's ``Tuner.lr_find``): stress step ``j`` (1-based) trains at
#: ``learning_rate * STRESS_GROWTH**j`` and the probe is read after every stress step; it stops at the first
#: divergence (:func:`divergence`, the rule that makes a trial ``diverged``), a non-finite loss or gradient norm, or an
#: fp16 overflow. Why 1.8x a step: the edges at the QLoRA recipe's rate lie far out. Measured on the built-in model
#: (30 constant steps at batch 1, then 1.6x a step): 281x the rate for lora_alpha/r 0.5 and 2 at 2e-4, 720x for 0.25
#: at 1e-4, 69x for lora_alpha/r 16 at r 16, batch 2. Reaching ~600x within the cost budget (below) takes 1.8x a
#: step; the probe reacts a few steps after the rate passes the edge at any growth, so a ceiling overshoots the edge by
#: a roughly constant number of steps, which the calibration factor (:data:`LONG_RUN_FACTOR`) absorbs.
STRESS_GROWTH = 1.8

#: Stress steps at most: the cap is ``STRESS_GROWTH**STRESS_STEPS`` (643x the trial's learning rate). Each stress step
#: costs a training step and a probe; measured at the default 30 steps, batch 1: 10 stress steps took 38-39% of the
#: constant phase's ``train_time_s``, 13 took 53% and 14 took 57%, so 11 stay under the 50% allowed (the measured share
#: is stored on each trial as ``stress_time_share``). A configuration that holds to the cap is recorded as capped
#: (``margin_capped``: the margin is a lower bound).
STRESS_STEPS = 11

#: ``stability_margin`` when the stress phase reached its last step without diverging (a lower bound).
STRESS_CAP = STRESS_GROWTH**STRESS_STEPS

#: Largest constant learning rate a long run holds at, over the short trial's ``lr_ceiling``: the calibration factor
#: that makes ``predicted_max_lr``. Measured by ``benchmarks/stability/validity.py``
#: (``benchmarks/stability/results/validity.md``, ``calibration_factor``) on the built-in model: the geometric mean over
#: the 8 configurations (learning rates 1e-4 to 5e-4, lora_alpha/r 0.25 to 32) whose 300-step edge was bisected to a
#: factor of 2, each edge taken as the geometric mean of the largest multiple that held and the smallest that failed.
#: Spread: 0.083 to 0.28 (geometric SD 1.51), so a ``predicted_max_lr`` is good to about a factor of 2 either way. A
#: range test's ceiling lies far above the constant-rate edge: the rate grows 1.8x a step while the probe is still
#: catching up.
LONG_RUN_FACTOR = 0.144

#: How a stress phase ended (``stress_stop``): the probe diverged, a loss or gradient norm went non-finite, the fp16
#: loss scaler skipped a step (an overflow), the cap was reached, or it could not be measured.
STRESS_STOPS = ("diverged", "nan", "overflow", "cap", "oom", "error")


def stress_lr(learning_rate: float, stress_step: int, growth: float = STRESS_GROWTH) -> float:
    """The learning rate of stress step ``stress_step`` (1-based): ``learning_rate * growth**stress_step`` (the
    growth per step, default :data:`STRESS_GROWTH`)."""
    return learning_rate * growth**stress_step


#: The seed noise of one short trial's margin, in ladder steps (factors of :data:`STRESS_GROWTH`): the pooled standard
#: deviation of ``log_1.8(margin)`` over seeds of one configuration at one rate (29 groups of the equal-step block's
#: short trials, ``margin_seed_sd_steps`` in ``benchmarks/stability/results/divergence_chance_fit.json``, issue 66).
MARGIN_SEED_SD_STEPS = 0.404

#: A margin's 95% interval in ladder steps each side, from its measured seed noise: ``1.96 x``
#: :data:`MARGIN_SEED_SD_STEPS` (0.79 steps: ``*/ 1.59``). Before issue 66 it was one whole step (``*/ 1.8``), a
#: constant wider than the noise measured.
MARGIN_NOISE_STEPS = 1.96 * MARGIN_SEED_SD_STEPS

#: The geometric standard deviation of :data:`LONG_RUN_FACTOR` over the configurations it was measured on (8 bisected
#: 300-step edges of the built-in model, 0.083 to 0.28): it holds both the short trial's seed noise and how far the
#: long-run edge departs from proportional to the ramp's ceiling.
LONG_RUN_FACTOR_GSD = 1.51

#: Where :data:`LONG_RUN_FACTOR` comes from, as every view says it of an uncalibrated ``predicted_max_lr``.
LONG_RUN_FACTOR_SOURCE = "uncalibrated: factor from SmolLM2-135M (8 edges, geometric SD 1.51)"

#: Standard normal quantile of a two-sided 95% interval: a prediction's interval is ``factor */ GSD**1.96``.
Z95 = 1.96


@dataclass(frozen=True, kw_only=True)
class LrCalibration:
    """The factor that turns a stress phase's ``lr_ceiling`` into ``predicted_max_lr``, with its spread.

    Attributes:
        factor: Long-run edge learning rate over ``lr_ceiling`` (the geometric mean over the edges measured).
        gsd: Its geometric standard deviation over those edges (>= 1); the 95% interval of a prediction is
            ``predicted */ gsd**1.96``.
        edges: How many edges it was measured on.
        source: One line for every view: ``uncalibrated: factor from SmolLM2-135M (...)`` or ``calibrated on this
            study's model (n edges, spread x)``.
        calibrated: Measured on the study's own model by ``sweep calibrate`` (its trials then need only their
            interval's low end above their rate: :class:`~sweeper.stability.Headroom`), not the built-in factor.
        mu, mu_se: The chance model's intercept refitted on the same edges, and its standard error
            (:func:`sweeper.stability._chance.refit_mu`): what varies by model (issue 66); None for a calibration
            stored before it, where the chance stays the built-in model's.
    """

    factor: float
    gsd: float
    edges: int
    source: str
    calibrated: bool = False
    mu: float | None = None
    mu_se: float | None = None

    @property
    def chance_model(self) -> DivergenceModel:
        """The chance model this calibration gives: the built-in one with :attr:`mu` refitted where there is one."""
        if self.mu is None or self.mu_se is None:
            return DIVERGENCE_MODEL
        return DIVERGENCE_MODEL.with_mu(self.mu, self.mu_se, f"{DIVERGENCE_MODEL.source}; mu refitted: {self.source}")

    @property
    def spread(self) -> float:
        """The 95% factor each side of a prediction: ``gsd ** 1.96``."""
        return self.gsd**Z95


#: The built-in factor, until ``sweep calibrate`` measures the study's own.
DEFAULT_LR_CALIBRATION = LrCalibration(
    factor=LONG_RUN_FACTOR, gsd=LONG_RUN_FACTOR_GSD, edges=8, source=LONG_RUN_FACTOR_SOURCE
)


@dataclass(frozen=True, kw_only=True)
class Margin:
    """A trial's distance to its divergence edge, from its stress phase, with the intervals of its figures.

    Attributes:
        lr_ceiling: The learning rate of the stress step after which the probe first showed the divergence (or a
            non-finite value, or an fp16 overflow); None when the cap was reached or nothing was measured.
        stability_margin: ``lr_ceiling / learning_rate`` (> 1); :data:`STRESS_CAP` when capped; None when not
            measured.
        stability_margin_low, stability_margin_high: Its interval from the seed noise (:data:`MARGIN_NOISE_STEPS`
            ladder steps each side); ``high`` is None when capped (unbounded above).
        margin_capped: The stress phase reached :data:`STRESS_CAP` without diverging (the margin is a lower bound).
        predicted_max_lr: The edge: the constant learning rate at which a run of ``horizon_steps`` steps diverges
            about half the time (:class:`~sweeper.stability._chance.DivergenceChance`); from a study's own calibration
            (``sweep calibrate``) ``lr_ceiling * factor``, the rate its bisected edges put the edge at. A lower bound
            when capped.
        predicted_max_lr_low, predicted_max_lr_high: Its 95% interval; ``high`` is None when capped.
        predicted_max_lr_source: Which model made it (the chance model's source, or :attr:`LrCalibration.source`).
        predicted_max_lr_calibrated: It came from the study's own calibration (:attr:`LrCalibration.calibrated`).
        horizon_steps, p_diverge, p_diverge_low, p_diverge_high, stability_call, safe_learning_rate: The
            :class:`~sweeper.stability._chance.DivergenceChance` of the margin at ``horizon_steps`` (its ``call`` as
            ``stability_call``); None when the margin is unknown.
    """

    lr_ceiling: float | None
    stability_margin: float | None
    margin_capped: bool | None
    predicted_max_lr: float | None
    stability_margin_low: float | None = None
    stability_margin_high: float | None = None
    predicted_max_lr_low: float | None = None
    predicted_max_lr_high: float | None = None
    predicted_max_lr_source: str | None = None
    predicted_max_lr_calibrated: bool | None = None
    horizon_steps: int | None = None
    p_diverge: float | None = None
    p_diverge_low: float | None = None
    p_diverge_high: float | None = None
    stability_call: str | None = None
    safe_learning_rate: float | None = None


def lr_calibration_of(raw: Any) -> LrCalibration | None:
    """The :class:`LrCalibration` stored as a study attribute by ``sweep calibrate`` (a mapping with ``factor``,
    ``gsd``, ``edges``, ``source``: measured on the study's model, so :attr:`LrCalibration.calibrated`), None when
    ``raw`` is not one (none stored, or unreadable)."""
    if not isinstance(raw, dict):
        return None
    try:
        factor, gsd, edges, source = float(raw["factor"]), float(raw["gsd"]), int(raw["edges"]), str(raw["source"])
        mu, mu_se = raw.get("mu"), raw.get("mu_se")
        mu, mu_se = (float(mu), float(mu_se)) if mu is not None and mu_se is not None else (None, None)
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(factor) and factor > 0 and math.isfinite(gsd) and gsd >= 1 and edges > 0):
        return None
    if mu is not None and not (math.isfinite(mu) and mu_se is not None and math.isfinite(mu_se) and mu_se > 0):
        mu, mu_se = None, None
    return LrCalibration(factor=factor, gsd=gsd, edges=edges, source=source, calibrated=True, mu=mu, mu_se=mu_se)


def margin_interval(
    margin: float | None, capped: bool | None, growth: float = STRESS_GROWTH
) -> tuple[float | None, float | None]:
    """The seed-noise interval of a margin: ``(margin / growth**k, margin * growth**k)`` with ``k`` =
    :data:`MARGIN_NOISE_STEPS`; ``(margin / growth**k, None)`` when capped (a lower bound); ``(None, None)`` when
    unknown."""
    if margin is None or not math.isfinite(margin) or margin <= 0:
        return None, None
    noise = growth**MARGIN_NOISE_STEPS
    return margin / noise, None if capped else margin * noise


def predicted_max_lr(
    learning_rate: float,
    lr_ceiling: float | None,
    capped: bool | None,
    calibration: LrCalibration = DEFAULT_LR_CALIBRATION,
    *,
    cap: float = STRESS_CAP,
) -> tuple[float | None, float | None, float | None]:
    """``(predicted_max_lr, low, high)`` of a stress phase: ``lr_ceiling * calibration.factor`` and its 95% interval
    (``*/ calibration.spread``); for a capped phase (its margin ``cap``, the stress phase's cap) ``learning_rate * cap
    * factor`` with no upper end (a lower bound); all None when nothing was measured."""
    if capped:
        value = learning_rate * cap * calibration.factor
        return value, value / calibration.spread, None
    if lr_ceiling is None or not math.isfinite(lr_ceiling):
        return None, None, None
    value = lr_ceiling * calibration.factor
    return value, value / calibration.spread, value * calibration.spread


def margin_of(
    learning_rate: float,
    stop: str | None,
    stress_step: int | None,
    *,
    growth: float = STRESS_GROWTH,
    steps: int = STRESS_STEPS,
    calibration: LrCalibration = DEFAULT_LR_CALIBRATION,
    horizon_steps: int = DEFAULT_HORIZON_STEPS,
) -> Margin:
    """The :class:`Margin` of a stress phase that ended with ``stop`` (one of :data:`STRESS_STOPS`) at 1-based
    ``stress_step`` (the step whose update showed the edge; ignored for ``cap``), for a stress phase of at most
    ``steps`` steps growing the rate ``growth`` times a step (defaults :data:`STRESS_STEPS`, :data:`STRESS_GROWTH`:
    its cap, ``growth**steps``, is then :data:`STRESS_CAP`), with its chance of diverging within ``horizon_steps``
    (:func:`~sweeper.stability._chance.divergence_chance`) and ``predicted_max_lr`` from that chance's edge, or from
    ``calibration`` where it is a study's own (:attr:`LrCalibration.calibrated`).

    Raises:
        ValueError: ``stop`` is not one of :data:`STRESS_STOPS`.
    """
    if stop is not None and stop not in STRESS_STOPS:
        raise ValueError(f"stress stop must be one of {STRESS_STOPS}, but got {stop!r}")
    if stop == "cap":
        cap = growth**steps
        ceiling, margin, capped = None, cap, True
    elif stop in ("diverged", "nan", "overflow") and stress_step is not None and stress_step >= 1:
        ceiling = stress_lr(learning_rate, stress_step, growth)
        margin, capped = ceiling / learning_rate, False
    else:
        return Margin(lr_ceiling=None, stability_margin=None, margin_capped=None, predicted_max_lr=None)
    return margin_from(learning_rate, margin, capped, ceiling, calibration=calibration, horizon_steps=horizon_steps)


def margin_from(
    learning_rate: float,
    stability_margin: float,
    capped: bool,
    lr_ceiling: float | None,
    *,
    calibration: LrCalibration = DEFAULT_LR_CALIBRATION,
    horizon_steps: int = DEFAULT_HORIZON_STEPS,
) -> Margin:
    """The :class:`Margin` of a measured ``stability_margin`` (``capped``: a lower bound, the stress phase's cap;
    ``lr_ceiling`` the rate it diverged at, None when capped) of a trial at ``learning_rate``: its seed-noise
    interval, its :func:`~sweeper.stability._chance.divergence_chance` at ``horizon_steps``, and
    ``predicted_max_lr``, the chance's edge, or ``lr_ceiling`` times ``calibration``'s factor where that is a
    study's own."""
    low, high = margin_interval(stability_margin, capped)
    chance = divergence_chance(learning_rate, stability_margin, capped, horizon_steps, calibration.chance_model)
    if calibration.calibrated or chance is None:
        predicted, p_low, p_high = predicted_max_lr(
            learning_rate, lr_ceiling, capped, calibration, cap=stability_margin
        )
        source = calibration.source
    else:
        predicted, p_low, p_high = chance.predicted_max_lr, chance.predicted_max_lr_low, chance.predicted_max_lr_high
        source = DIVERGENCE_MODEL.source
    return Margin(
        lr_ceiling=lr_ceiling,
        stability_margin=stability_margin,
        margin_capped=capped,
        predicted_max_lr=predicted,
        stability_margin_low=low,
        stability_margin_high=high,
        predicted_max_lr_low=p_low,
        predicted_max_lr_high=p_high,
        predicted_max_lr_source=source,
        predicted_max_lr_calibrated=calibration.calibrated,
        horizon_steps=None if chance is None else chance.horizon_steps,
        p_diverge=None if chance is None else chance.p_diverge,
        p_diverge_low=None if chance is None else chance.p_diverge_low,
        p_diverge_high=None if chance is None else chance.p_diverge_high,
        stability_call=None if chance is None else chance.call,
        safe_learning_rate=None if chance is None else chance.safe_learning_rate,
    )


#: The figures :func:`derive_margin_figures` derives from a stored margin (:class:`Margin`'s fields less what was
#: measured: the margin, its cap and ``lr_ceiling``).
MARGIN_FIGURES = (
    "stability_margin_low", "stability_margin_high", "predicted_max_lr", "predicted_max_lr_low",
    "predicted_max_lr_high", "predicted_max_lr_source", "predicted_max_lr_calibrated", "horizon_steps", "p_diverge",
    "p_diverge_low", "p_diverge_high", "stability_call", "safe_learning_rate",
)  # fmt: skip


def derive_margin_figures(
    stress: Any,
    learning_rate: float | None,
    calibration: LrCalibration | None = None,
    horizon_steps: int | None = None,
) -> None:
    """Set on ``stress`` (a stored ``StressOutcome``: any object with :class:`Margin`'s fields) the figures
    (:data:`MARGIN_FIGURES`) its measured ``stability_margin`` gives at ``learning_rate`` (:func:`margin_from`): at
    ``horizon_steps`` (None: :data:`~sweeper.stability._chance.DEFAULT_HORIZON_STEPS`), ``predicted_max_lr`` from a
    study's own ``calibration`` where there is one. Without a margin nothing is set; without a rate only the
    margin's interval."""
    margin = stress.stability_margin
    if margin is None:
        return
    if learning_rate is None:
        stress.stability_margin_low, stress.stability_margin_high = margin_interval(margin, stress.margin_capped)
        return
    capped = bool(stress.margin_capped)
    ceiling = None if capped else stress.lr_ceiling or margin * learning_rate
    found = margin_from(
        learning_rate,
        margin,
        capped,
        ceiling,
        calibration=calibration or DEFAULT_LR_CALIBRATION,
        horizon_steps=horizon_steps or DEFAULT_HORIZON_STEPS,
    )
    for name in MARGIN_FIGURES:
        setattr(stress, name, getattr(found, name))


def edge_proximity(stability_margin: float | None) -> float | None:
    """``1 / stability_margin``: the study's second objective (minimized), in (0, 1) for a trial that held its rate;
    the learning rate as a share of the rate it diverged at. None when the margin is unknown."""
    if stability_margin is None or not math.isfinite(stability_margin) or stability_margin <= 0:
        return None
    return 1.0 / stability_margin
