"""Instability: one number from a short run, higher = closer to divergence, 0 for a run that cannot diverge; and the
rule that calls a run ``diverged`` before it goes NaN.

Both read the **probe**: a fixed batch of :data:`PROBE_ROWS` samples (the first of the trial's data that keep a
supervised token after truncation) whose loss the trial process evaluates without an update, in eval mode (no
dropout), before the first step and every :func:`probe_interval_steps` steps. The probe sees the same samples every
time, so its loss changes only when the model does: a run with learning rate 0 has a constant probe loss, whatever
its batch size or ``max_seq_length``, and scores 0. The training loss, by contrast, changes with each batch's
samples; its step-to-step variety (which made the first instability score ~0.6 for a run that learned nothing) is
kept only as a diagnostic (:func:`loss_spike`, :func:`grad_norm_growth`).

Pure (no torch import): it runs on the JSON trace a trial process returns, so it tests in milliseconds on synthetic
traces and can be recomputed for stored trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: The terms summed into the instability, in order; each is stored on every trial (None when not measured).
COMPONENTS = ("probe_rebound", "activation_growth", "skipped_step_fraction")
#: Recorded for each trial, not summed: they move with the training batches' samples, not only with the model.
DIAGNOSTICS = ("loss_spike", "grad_norm_growth")
#: The terms of the first definition (sweeper 0.1.0), stored on the trials of studies it wrote.
LEGACY_COMPONENTS = ("loss_spike", "grad_norm_growth", "skipped_step_fraction", "activation_pressure")
#: Every term name a stored trial may carry.
STORED_COMPONENTS = tuple(dict.fromkeys((*COMPONENTS, *DIAGNOSTICS, *LEGACY_COMPONENTS)))

#: Largest finite value of each compute dtype (``torch.finfo(dtype).max``; IEEE 754 binary16/binary32, bfloat16).
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}

#: Samples in the probe batch. The probe sees the same rows every time, so two suffice to see the model change; more
#: rows would make its forward need more memory than a training step at batch 1.
PROBE_ROWS = 2

#: Target share of training time spent on the probe; the measured share is recorded on each trial
#: (``probe_time_share``).
PROBE_SHARE = 0.10

#: Cost of one probe (a forward of its rows without gradients) in training steps at batch 1. A step runs the forward,
#: the backward at about twice it, and the forward again under gradient checkpointing; at short lengths the fixed
#: cost of each pass (dequantizing every 4-bit weight) dominates, so a step's cost grows about as the square root of
#: its rows. Measured on the built-in model on the CPU (64 tokens a row, bfloat16, 40 steps): a probe cost 0.37 of a
#: step at batch 1 (9.3% of training, probing every 4 steps) and 0.20 at batch 4 (20.4%, probing every step). In
#: float32 on the CPU it costs about 0.5 of a step (a median 15-16% of the constant phase at batch 1:
#: ``docs/validity.md``); the schedule is kept there because probing less often loses most of what the instability
#: foretells (``benchmarks/probe_schedule.py``: AUC 0.86 every 4 steps, 0.62 every 16).
PROBE_COST = 0.4

#: The probe loss at this multiple of its value before the first step (or non-finite) is a divergence once it stays
#: there: at the next probe, or at the last probe of the run. Measured against the start, not the best value: a run
#: that learned and then lost part of it is unstable (scored by :func:`probe_rebound`) but has not diverged. In
#: ``benchmarks/results/validity.md`` configuration 4 went from its best 2.06 to 7.60 (1.67x its start) at one probe,
#: fell back at the next and completed 300 steps at 0.79x its start, while every run that failed ended at 1.7-7.4x.
DIVERGED_RATIO = 1.5

#: Steps of loss history a spike is measured against (a median over them, so one noisy batch does not set the base).
SPIKE_WINDOW = 5

#: The fp16 loss scaler starts at 2**16 and halves its scale on each overflow until a step fits: these leading skips
#: are its calibration (``torch.amp.GradScaler``, ``init_scale=65536``), not instability.
CALIBRATION_SKIPS = 17


@dataclass(frozen=True, kw_only=True)
class InstabilityComponents:
    """The terms of :func:`compute_instability`, each dimensionless and >= 0.

    Attributes:
        probe_rebound: Largest relative rise of the probe loss over its lowest value before (:func:`probe_rebound`).
        activation_growth: Share of the compute dtype's headroom that the probe's largest activation used up over the
            run, in [0, 1]; 0 for float32 compute (:func:`activation_growth`).
        skipped_step_fraction: Share of optimizer steps the fp16 loss scaler skipped after its calibration, in [0, 1].
        loss_spike: Diagnostic, not summed (:func:`loss_spike`).
        grad_norm_growth: Diagnostic, not summed (:func:`grad_norm_growth`).
        instability: ``probe_rebound + activation_growth + skipped_step_fraction``.
    """

    probe_rebound: float
    activation_growth: float
    skipped_step_fraction: float
    loss_spike: float
    grad_norm_growth: float
    instability: float

    def to_dict(self) -> dict[str, float]:
        """The fields as a plain dict."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """A run whose probe loss rose to :data:`DIVERGED_RATIO` times its start and stayed there.

    Attributes:
        step: The optimizer step at which it was confirmed (the probe that showed it stayed).
        first_step: The first probe step at or above the ratio.
        ratio: The probe loss at ``step`` over its value before the first step (``inf`` when non-finite).
        reason: One line with the evidence, for people.
    """

    step: int
    first_step: int
    ratio: float
    reason: str


def _finite(xs: Sequence[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def probe_interval_steps(per_device_train_batch_size: int, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps between two probes: ``ceil(PROBE_COST / (sqrt(rows_per_step) * PROBE_SHARE))``, at least 1,
    so that the probe costs about :data:`PROBE_SHARE` of training (see :data:`PROBE_COST` for the square root).

    Batch 1 probes every 4 steps, batch 2 every 3, batches 4 to 15 every 2, batch 16 and more every step.
    """
    rows = max(1, per_device_train_batch_size * gradient_accumulation_steps)
    return max(1, math.ceil(PROBE_COST / (math.sqrt(rows) * PROBE_SHARE) - 1e-9))


def probe_rebound(probe_loss: Sequence[float | None]) -> float:
    """``max_t L_t / min_{s<t} L_s - 1`` over the probe losses, floored at 0; a non-finite probe after a finite one
    counts as :data:`DIVERGED_RATIO` (a rise at least that large).

    Why: on fixed samples a stable fine-tune's loss falls, or holds once learned; any rise is the model getting worse
    at what it had learned, the first sign of a step size too large for the landscape (the loss spikes that precede
    divergence: Chowdhery et al. 2022, PaLM, sec. 5.1; Wortsman et al. 2023, "Small-scale proxies for large-scale
    Transformer training instabilities"). Measuring against the lowest value so far catches a run that learns first
    and diverges later, which a rise over the start misses. 0 for a constant probe (learning rate 0).
    """
    best = math.inf
    worst = 0.0
    for x in probe_loss:
        if x is None or not math.isfinite(x):
            if math.isfinite(best):
                worst = max(worst, DIVERGED_RATIO - 1.0)
            continue
        if math.isfinite(best) and best > 0:
            worst = max(worst, x / best - 1.0)
        best = min(best, x)
    return worst


def activation_growth(probe_max_activation: Sequence[float | None], compute_dtype: str) -> float:
    """The share of the compute dtype's headroom used up by the probe's largest activation over the run:
    ``clip(log2(max_t A_t / A_0) / log2(dtype_max / A_0), 0, 1)``; 1 when it overflowed; 0 for float32 compute.

    Why: in fp16 an activation past 65504 becomes inf and the loss NaN. The headroom a model starts with is its own
    (a property of the weights, the same at any learning rate); a run whose activations grow toward the limit is on
    its way to overflow, and the share of the headroom it used is how far along that way it is. The probe's
    activations are measured on the same samples every time, so they grow only when the weights do.

    Args:
        probe_max_activation: Largest absolute input or output of the 4-bit layers during each probe.
        compute_dtype: ``bfloat16``, ``float16`` or ``float32``.
    """
    if compute_dtype == "float32":
        return 0.0
    values = [x for x in probe_max_activation if x is not None]
    if len(values) < 2:
        return 0.0
    start = values[0]
    if not math.isfinite(start) or start <= 0:
        return 0.0
    peak = max(values[1:])
    if not math.isfinite(peak) or peak >= DTYPE_MAX[compute_dtype]:
        return 1.0
    headroom = math.log2(DTYPE_MAX[compute_dtype] / start)
    if headroom <= 0:
        return 1.0
    return min(1.0, max(0.0, math.log2(peak / start) / headroom))


def skipped_step_fraction(skipped: Sequence[bool], steps: int) -> float:
    """Share of optimizer steps the fp16 loss scaler skipped, after its calibration (up to :data:`CALIBRATION_SKIPS`
    skips in a row from the first step).

    Why: ``torch.amp.GradScaler`` skips a step whenever the scaled gradients overflow; its first skips find the
    scale, a steady rate later means fp16 gradients live at the edge of their range. 0 when ``steps`` is 0.
    """
    if steps <= 0:
        return 0.0
    flags = list(skipped)
    lead = 0
    while lead < len(flags) and lead < CALIBRATION_SKIPS and flags[lead]:
        lead += 1
    return sum(1 for s in flags[lead:] if s) / steps


def loss_spike(loss: Sequence[float | None], window: int = SPIKE_WINDOW) -> float:
    """Diagnostic: largest ``L_t / median(L_{t-window}..L_{t-1}) - 1`` of the training loss, floored at 0.

    Not summed into the instability: the training loss of one step depends on its samples, so this term measured the
    data's variety as much as the run (0.63 for a run with learning rate 1e-9 on the built-in data).
    """
    xs = _finite(loss)
    worst = 0.0
    for t in range(1, len(xs)):
        base = statistics.median(xs[max(0, t - window) : t])
        if base > 0:
            worst = max(worst, xs[t] / base - 1.0)
    return worst


def grad_norm_growth(grad_norm: Sequence[float | None]) -> float:
    """Diagnostic: ``max(0, log2(median(last third) / median(first third)))`` of the pre-clip gradient norm.

    Not summed into the instability: it moves with the batches' samples, and a norm that explodes in the first third
    and stays high scores 0.
    """
    xs = _finite(grad_norm)
    if len(xs) < 3:
        return 0.0
    third = max(1, len(xs) // 3)
    early, late = statistics.median(xs[:third]), statistics.median(xs[-third:])
    if early <= 0 or late <= 0:
        return 0.0
    return max(0.0, math.log2(late / early))


def divergence(probe_steps: Sequence[int], probe_loss: Sequence[float | None], *, final: bool) -> Divergence | None:
    """Whether the run diverged: its probe loss reached :data:`DIVERGED_RATIO` times its value before the first step
    (or became non-finite) and stayed there at the next probe; with ``final``, the last probe at or above the ratio
    counts as staying (the run ends there).

    Args:
        probe_steps: The optimizer step of each probe (0 before the first step), increasing.
        probe_loss: The probe loss at each, None where non-finite.
        final: The last probe is the run's last.

    Returns:
        The :class:`Divergence`, or None.
    """
    if len(probe_loss) < 2 or probe_loss[0] is None or not math.isfinite(probe_loss[0]) or probe_loss[0] <= 0:
        return None
    start = probe_loss[0]
    ratios = [math.inf if x is None or not math.isfinite(x) else x / start for x in probe_loss]
    high = [r >= DIVERGED_RATIO for r in ratios]
    for i in range(1, len(ratios)):
        confirmed = high[i] and ((i + 1 < len(ratios) and high[i + 1]) or (final and i == len(ratios) - 1))
        if not confirmed:
            continue
        at = i + 1 if i + 1 < len(ratios) else i

        def shown(r: float, x: float | None) -> str:
            return "non-finite" if x is None or not math.isfinite(x) else f"{x:.3g} ({r:.2f}x)"

        evidence = ", ".join(f"{shown(ratios[j], probe_loss[j])} at step {probe_steps[j]}" for j in range(i, at + 1))
        return Divergence(
            step=probe_steps[at],
            first_step=probe_steps[i],
            ratio=ratios[at],
            reason=f"diverged at step {probe_steps[at]}: the probe loss went from {start:.3g} before the first step "
            f"to {evidence}, and stayed at >= {DIVERGED_RATIO:g}x its start",
        )
    return None


def projected_fail_step(probe_steps: Sequence[int], probe_loss: Sequence[float | None]) -> int | None:
    """The step at which the probe loss would reach :data:`DIVERGED_RATIO` times its start, extrapolating the log
    probe loss linearly (least squares) from its lowest point to the end of the run; None when it is not rising
    after that point, or fewer than two probes follow it.

    A short trial's probe that has turned upward says when, at that rate, a long run would be called diverged; it is
    a projection, reported beside the measured outcome, not a result.
    """
    pairs = [(s, x) for s, x in zip(probe_steps, probe_loss) if x is not None and math.isfinite(x) and x > 0]
    if len(pairs) < 3:
        return None
    start = pairs[0][1]
    low = min(range(len(pairs)), key=lambda i: pairs[i][1])
    tail = pairs[low:]
    if len(tail) < 2:
        return None
    xs = [float(s) for s, _ in tail]
    ys = [math.log(x) for _, x in tail]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        return None
    target = math.log(start * DIVERGED_RATIO)
    step = mx + (target - my) / slope
    return max(math.ceil(step), int(xs[-1]))


def compute_instability(
    *,
    probe_loss: Sequence[float | None],
    probe_max_activation: Sequence[float | None] = (),
    skipped: Sequence[bool] = (),
    steps: int | None = None,
    compute_dtype: str = "float32",
    loss: Sequence[float | None] = (),
    grad_norm: Sequence[float | None] = (),
) -> InstabilityComponents:
    """Instability of a short run: ``probe_rebound + activation_growth + skipped_step_fraction``.

    Each term is dimensionless and 0 for a run that cannot diverge (learning rate 0: the probe is constant, the
    activations do not grow, nothing overflows); see each function for its formula and reason. They are summed
    unweighted so that each reads directly: 0.5 is "the probe loss rose 50% over its best", or "activations used half
    of the headroom they started with", or "half the steps were skipped". Non-finite entries (the failing step of a
    NaN trial) are handled by each term, so a pruned trial still gets its components.

    Args:
        probe_loss: Probe loss before the first step and at each probe, None where non-finite.
        probe_max_activation: Largest |activation| of the 4-bit layers during each probe (empty for float32).
        skipped: Per step, whether the fp16 loss scaler skipped it (empty when there is no scaler).
        steps: Optimizer steps run (default ``len(loss)``), the denominator of the skipped fraction.
        compute_dtype: ``bfloat16``, ``float16`` or ``float32``.
        loss: Raw training loss per optimizer step (diagnostic only).
        grad_norm: Gradient norm before clipping per optimizer step (diagnostic only).

    Raises:
        ValueError: ``compute_dtype`` is not one of the three.
    """
    if compute_dtype not in DTYPE_MAX:
        raise ValueError(f"compute_dtype must be one of {sorted(DTYPE_MAX)}, but got {compute_dtype!r}")
    parts = {
        "probe_rebound": probe_rebound(probe_loss),
        "activation_growth": activation_growth(probe_max_activation, compute_dtype),
        "skipped_step_fraction": skipped_step_fraction(skipped, len(loss) if steps is None else steps),
    }
    return InstabilityComponents(
        **parts,
        loss_spike=loss_spike(loss),
        grad_norm_growth=grad_norm_growth(grad_norm),
        instability=sum(parts.values()),
    )


def format_instability(value: float | None) -> str:
    """An instability as shown everywhere: 3 decimals, ``0`` for exactly zero, and 3 significant digits below 0.001
    (``6.85e-05``), so that a trial on the front never reads as ``0.000`` beside one that is exactly 0 (which would
    make it look dominated). ``-`` when it is unknown (a trial that did not complete)."""
    if value is None or not isinstance(value, (int, float)):
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2e}" if abs(value) < 0.001 else f"{value:.3f}"


# --- The stability margin: how far a configuration is from its divergence edge --------------------------------------

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
#: that makes ``predicted_max_lr``. Measured by ``benchmarks/validity.py`` (``benchmarks/results/validity.md``,
#: ``calibration_factor``) on the built-in model: the geometric mean over the 8 configurations (learning rates 1e-4 to
#: 5e-4, lora_alpha/r 0.25 to 32) whose 300-step edge was bisected to a factor of 2, each edge taken as the geometric
#: mean of the largest multiple that held and the smallest that failed. Spread: 0.083 to 0.28 (geometric SD 1.51), so
#: a ``predicted_max_lr`` is good to about a factor of 2 either way. A range test's ceiling lies far above the
#: constant-rate edge: the rate grows 1.8x a step while the probe is still catching up.
LONG_RUN_FACTOR = 0.144

#: How a stress phase ended (``stress_stop``): the probe diverged, a loss or gradient norm went non-finite, the fp16
#: loss scaler skipped a step (an overflow), the cap was reached, or it could not be measured.
STRESS_STOPS = ("diverged", "nan", "overflow", "cap", "oom", "error")

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


def stress_lr(learning_rate: float, stress_step: int, growth: float = STRESS_GROWTH) -> float:
    """The learning rate of stress step ``stress_step`` (1-based): ``learning_rate * growth**stress_step`` (the
    growth per step, default :data:`STRESS_GROWTH`)."""
    return learning_rate * growth**stress_step


#: The seed noise of one short trial's margin, in ladder steps (factors of :data:`STRESS_GROWTH`) each side: the
#: margin of the same configuration at another ``seed`` (LoRA's initialisation and the data order) lies within one
#: step of it. Measured: 4 configurations near their edge at 2-3 seeds each moved by at most one step (3 of 4 by one);
#: ``benchmarks/validity_block.py`` measures it on 12 configurations at 3 seeds (``margin_seed_spread_steps`` in
#: ``benchmarks/results/validity_block.md``). A margin's interval is ``[margin / growth, margin * growth]``.
MARGIN_NOISE_STEPS = 1

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
    """

    factor: float
    gsd: float
    edges: int
    source: str

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
        predicted_max_lr: ``lr_ceiling * factor`` (the calibration's, default :data:`LONG_RUN_FACTOR`): the largest
            constant learning rate a long run is predicted to hold at; a lower bound when capped.
        predicted_max_lr_low, predicted_max_lr_high: Its 95% interval, ``predicted */ gsd**1.96``; ``high`` is None
            when capped.
        predicted_max_lr_source: Which factor made it (:attr:`LrCalibration.source`).
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


def lr_calibration_of(raw: Any) -> LrCalibration | None:
    """The :class:`LrCalibration` stored as a study attribute by ``sweep calibrate`` (a mapping with ``factor``,
    ``gsd``, ``edges``, ``source``), None when ``raw`` is not one (none stored, or unreadable)."""
    if not isinstance(raw, dict):
        return None
    try:
        factor, gsd, edges, source = float(raw["factor"]), float(raw["gsd"]), int(raw["edges"]), str(raw["source"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(factor) and factor > 0 and math.isfinite(gsd) and gsd >= 1 and edges > 0):
        return None
    return LrCalibration(factor=factor, gsd=gsd, edges=edges, source=source)


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
) -> Margin:
    """The :class:`Margin` of a stress phase that ended with ``stop`` (one of :data:`STRESS_STOPS`) at 1-based
    ``stress_step`` (the step whose update showed the edge; ignored for ``cap``), for a stress phase of at most
    ``steps`` steps growing the rate ``growth`` times a step (defaults :data:`STRESS_STEPS`, :data:`STRESS_GROWTH`:
    its cap, ``growth**steps``, is then :data:`STRESS_CAP`), with ``predicted_max_lr`` from ``calibration``.

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
    low, high = margin_interval(margin, capped, growth)
    predicted, p_low, p_high = predicted_max_lr(learning_rate, ceiling, capped, calibration, cap=growth**steps)
    return Margin(
        lr_ceiling=ceiling,
        stability_margin=margin,
        margin_capped=capped,
        predicted_max_lr=predicted,
        stability_margin_low=low,
        stability_margin_high=high,
        predicted_max_lr_low=p_low,
        predicted_max_lr_high=p_high,
        predicted_max_lr_source=calibration.source,
    )


#: The least headroom (``predicted_max_lr / learning_rate``) at which a trial whose ``predicted_max_lr`` is
#: uncalibrated counts as safely below its edge, whatever its interval says: the issue that asked for headroom set it,
#: and the built-in factor's own 95% spread (``1.51**1.96`` = 2.24) already asks for more. A study's own calibration
#: (``sweep calibrate``) may allow less: its trials need only their interval's low end above their rate.
MIN_UNCALIBRATED_HEADROOM = 2.0

#: How a calibrated ``predicted_max_lr_source`` begins (``sweep calibrate``'s :class:`LrCalibration`).
CALIBRATED_SOURCE_PREFIX = "calibrated on this study's model"


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """How many times its own learning rate a trial's long run is predicted to hold: ``predicted_max_lr /
    learning_rate``, with the 95% interval of ``predicted_max_lr`` (:func:`predicted_max_lr`) divided alike. A
    user's question, "can I train this at my rate, and how much room is there", in the user's units.

    Attributes:
        value: ``predicted_max_lr / learning_rate`` (> 0); a lower bound when ``capped``.
        low: The low end of its 95% interval.
        high: The high end, None when ``capped`` (the stress phase reached its cap: no upper end).
        capped: The stress phase reached its cap without diverging.
        calibrated: ``predicted_max_lr`` came from the study's own factor (``sweep calibrate``), not the built-in one.
    """

    value: float
    low: float
    high: float | None
    capped: bool
    calibrated: bool

    @property
    def safety_factor(self) -> float:
        """The headroom below which the trial is :attr:`near_edge`: the factor from ``value`` down to the interval's
        low end (``gsd**1.96`` of its calibration), and at least :data:`MIN_UNCALIBRATED_HEADROOM` when
        uncalibrated."""
        spread = self.value / self.low if self.low > 0 else math.inf
        return max(spread, MIN_UNCALIBRATED_HEADROOM) if not self.calibrated else spread

    @property
    def near_edge(self) -> bool:
        """Whether a long run at the trial's own rate may fail within the prediction's noise: ``value`` below
        :attr:`safety_factor` (equivalently, uncalibrated: the interval's low end under 1 or the headroom under 2)."""
        return self.value < self.safety_factor * (1 - 1e-9)

    @property
    def edge_phrase(self) -> str:
        """How a line names a trial :attr:`near_edge`: ``above its predicted edge`` when ``value`` is below 1 (its own
        rate is over ``predicted_max_lr``, predicted to fail), else ``near its edge``."""
        return "above its predicted edge" if self.value < 1 else "near its edge"


def headroom_of(learning_rate: float | None, stress: Any) -> Headroom | None:
    """The :class:`Headroom` of a trial trained at ``learning_rate`` whose stress phase measured ``stress`` (any
    object with ``predicted_max_lr``, ``predicted_max_lr_low``, ``predicted_max_lr_high``, ``margin_capped`` and
    ``predicted_max_lr_source``: a :class:`Margin`, a stored ``StressOutcome``, a report row); None when either is
    unknown. A prediction stored without its interval gets the built-in spread."""
    predicted = getattr(stress, "predicted_max_lr", None)
    if learning_rate is None or not learning_rate > 0 or predicted is None or not math.isfinite(predicted):
        return None
    capped = bool(getattr(stress, "margin_capped", False))
    low = getattr(stress, "predicted_max_lr_low", None)
    high = getattr(stress, "predicted_max_lr_high", None)
    if low is None:
        low = predicted / DEFAULT_LR_CALIBRATION.spread
        high = None if capped else predicted * DEFAULT_LR_CALIBRATION.spread
    source = getattr(stress, "predicted_max_lr_source", None) or ""
    return Headroom(
        value=predicted / learning_rate,
        low=low / learning_rate,
        high=None if capped or high is None else high / learning_rate,
        capped=capped,
        calibrated=source.startswith(CALIBRATED_SOURCE_PREFIX),
    )


def format_headroom(headroom: Headroom | None, *, mark: bool = True) -> str:
    """A headroom with its interval as every view shows it (:func:`format_headroom_range`); ``mark`` adds ``near
    edge`` when it is :attr:`Headroom.near_edge`; ``-`` when unknown."""
    if headroom is None:
        return "-"
    high = None if headroom.capped else headroom.high
    return format_headroom_range(headroom.value, headroom.low, high, mark and headroom.near_edge)


def format_headroom_range(value: float | None, low: float | None, high: float | None, near_edge: bool | None) -> str:
    """``16x (7.1-36x)``, ``>=42x (>=19x)`` without a high end (capped), with ``, near edge`` inside the parentheses
    when ``near_edge`` (``, above edge`` when the headroom is below 1: the trial's own rate is above its
    ``predicted_max_lr``); ``-`` when unknown."""
    if value is None or low is None:
        return "-"
    near = (", above edge" if value < 1 else ", near edge") if near_edge else ""
    if high is None:
        return f"{format_margin(value, True)} (>={format_margin(low)}{near})"
    return f"{format_margin(value)} ({format_margin(low)[:-1]}-{format_margin(high)}{near})"


def _finite_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def round_figure(x: float | None, digits: int) -> float | None:
    """``x`` as an export writes it: ``digits`` significant digits when ``digits`` > 4 (learning rates), else
    ``digits`` decimals (margins, headroom, fractions); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}") if digits > 4 else round(x, digits)


@dataclass(frozen=True, kw_only=True)
class StabilityFigures:
    """A trial's stability figures as every view shows them: what its stress phase measured (:class:`Margin`'s
    fields) and the :class:`Headroom` that gives at its learning rate, flat, in the order of ``sweep report
    --json`` and the JSON export's ``provenance`` (``docs/contract.md``). Declared once here: the report's rows
    (``TrialRecord``, ``FrontRow``) and the export's ``Provenance`` each hold one and flatten it with :meth:`to_dict`.

    Attributes:
        stability_margin: How many times its learning rate the stress phase reached before diverging (> 1), None when
            not measured.
        margin_capped: The stress phase reached its cap without diverging: the margin is a lower bound (None: not
            measured).
        lr_ceiling: The learning rate the stress phase diverged at, None when it did not.
        predicted_max_lr: The largest constant learning rate a long run is predicted to hold at, or None.
        stability_margin_low, stability_margin_high: The margin's seed-noise interval (``high`` None when capped).
        predicted_max_lr_low, predicted_max_lr_high: ``predicted_max_lr``'s 95% interval (``high`` None when capped).
        predicted_max_lr_source: Which factor made ``predicted_max_lr`` (calibrated on this study, or not).
        headroom, headroom_low, headroom_high: ``predicted_max_lr / learning_rate`` and its 95% interval (``high``
            None when capped): how many times its own rate a long run is predicted to hold (:class:`Headroom`); None
            when not measured.
        near_edge: :attr:`Headroom.near_edge`; None when not measured.
    """

    stability_margin: float | None = None
    margin_capped: bool | None = None
    lr_ceiling: float | None = None
    predicted_max_lr: float | None = None
    stability_margin_low: float | None = None
    stability_margin_high: float | None = None
    predicted_max_lr_low: float | None = None
    predicted_max_lr_high: float | None = None
    predicted_max_lr_source: str | None = None
    headroom: float | None = None
    headroom_low: float | None = None
    headroom_high: float | None = None
    near_edge: bool | None = None

    @classmethod
    def of(cls, stress: Any, headroom: Headroom | None) -> StabilityFigures:
        """The figures of ``stress`` (any object with :class:`Margin`'s fields: a stored ``StressOutcome``, a
        :class:`Margin`) and ``headroom`` (None: not measured); a non-finite number becomes None."""
        return cls(
            stability_margin=_finite_or_none(stress.stability_margin),
            margin_capped=stress.margin_capped,
            lr_ceiling=_finite_or_none(stress.lr_ceiling),
            predicted_max_lr=_finite_or_none(stress.predicted_max_lr),
            stability_margin_low=_finite_or_none(stress.stability_margin_low),
            stability_margin_high=_finite_or_none(stress.stability_margin_high),
            predicted_max_lr_low=_finite_or_none(stress.predicted_max_lr_low),
            predicted_max_lr_high=_finite_or_none(stress.predicted_max_lr_high),
            predicted_max_lr_source=stress.predicted_max_lr_source,
            headroom=None if headroom is None else _finite_or_none(headroom.value),
            headroom_low=None if headroom is None else _finite_or_none(headroom.low),
            headroom_high=None if headroom is None else _finite_or_none(headroom.high),
            near_edge=None if headroom is None else headroom.near_edge,
        )

    def rounded(self) -> StabilityFigures:
        """As an export's header writes them: margins to 1 decimal, learning rates to 6 significant digits,
        headroom to 2 decimals; ``near_edge`` as measured (before rounding)."""
        return StabilityFigures(
            stability_margin=round_figure(self.stability_margin, 1),
            margin_capped=self.margin_capped,
            lr_ceiling=round_figure(self.lr_ceiling, 6),
            predicted_max_lr=round_figure(self.predicted_max_lr, 6),
            stability_margin_low=round_figure(self.stability_margin_low, 1),
            stability_margin_high=round_figure(self.stability_margin_high, 1),
            predicted_max_lr_low=round_figure(self.predicted_max_lr_low, 6),
            predicted_max_lr_high=round_figure(self.predicted_max_lr_high, 6),
            predicted_max_lr_source=self.predicted_max_lr_source,
            headroom=round_figure(self.headroom, 2),
            headroom_low=round_figure(self.headroom_low, 2),
            headroom_high=round_figure(self.headroom_high, 2),
            near_edge=self.near_edge,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields in order, as plain values (the keys of the JSON contract)."""
        return asdict(self)

    def headroom_text(self) -> str:
        """The headroom with its interval as every view shows it (:func:`format_headroom_range`)."""
        return format_headroom_range(self.headroom, self.headroom_low, self.headroom_high, self.near_edge)


#: The seed noise of a short trial's ``learning_progress`` (absolute, a fraction) away from its edge: the
#: ``learning_progress`` objective's interval is ``value +/- LEARNING_PROGRESS_NOISE`` for a trial whose headroom is
#: safe. Measured by ``benchmarks/seed_noise.py`` (the built-in model at 2e-4, 12 steps, 3 seeds, two
#: configurations: standard deviations 0.0008 and 0.0006, ``benchmarks/results/seed_noise.json``); 0.01 leaves room
#: for other models and data, on which it is not measured.
LEARNING_PROGRESS_NOISE = 0.01

#: The same near the edge (a trial whose headroom is :attr:`Headroom.near_edge`, or whose margin was not measured):
#: the pooled standard deviation over seeds of 11 configurations at 3 seeds in ``benchmarks/validity_block.py``, all
#: near their edge, where runs also unlearn (progress from -0.85 to 0.41).
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


def edge_proximity(stability_margin: float | None) -> float | None:
    """``1 / stability_margin``: the study's second objective (minimized), in (0, 1) for a trial that held its rate;
    the learning rate as a share of the rate it diverged at. None when the margin is unknown."""
    if stability_margin is None or not math.isfinite(stability_margin) or stability_margin <= 0:
        return None
    return 1.0 / stability_margin


def format_margin_range(
    value: float | None, capped: bool | None, low: float | None, high: float | None, *, source: bool = False
) -> str:
    """A margin with its interval, as every view shows it: ``5.8x (3.2-10x)``, ``>=643x (>=357x)`` when capped,
    the bare margin when it has no interval, ``-`` when unknown. ``source`` adds where the interval comes from
    (``, seed noise``)."""
    shown = format_margin(value, capped)
    if shown == "-" or low is None:
        return shown
    why = ", seed noise" if source else ""
    if capped or high is None:
        return f"{shown} (>={format_margin(low)}{why})"
    return f"{shown} ({format_margin(low)[:-1]}-{format_margin(high)}{why})"


def format_rate_range(value: float | None, low: float | None, high: float | None) -> str:
    """A predicted learning rate with its 95% interval: ``3.36e-03 (1.5e-03-7.5e-03)``, ``>=0.37 (>=0.17)`` for a
    lower bound (no high end), ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if low is None:
        return f"{value:.3g}"
    if high is None:
        return f">={value:.3g} (>={low:.2g})"
    return f"{value:.3g} ({low:.2g}-{high:.2g})"


def format_margin(value: float | None, capped: bool | None = False) -> str:
    """A margin as shown everywhere: ``12x``, ``3.4x``, ``>=57.7x`` when capped, ``-`` when unknown."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    shown = f"{value:.1f}x" if value < 10 else f"{value:.0f}x"
    return (">=" + shown) if capped else shown
