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

#: The terms summed into the instability, in order; each is stored on every trial (None when not measured).
COMPONENTS = ("probe_rebound", "activation_growth", "skipped_step_fraction")
#: Recorded for each trial, not summed: they move with the training batches' samples, not only with the model.
DIAGNOSTICS = ("loss_spike", "grad_norm_growth")
#: The terms a trial records: the instability's components, then the diagnostics.
RECORDED_COMPONENTS = (*COMPONENTS, *DIAGNOSTICS)
#: The terms of the first definition (sweeper 0.1.0), stored on the trials of studies it wrote.
LEGACY_COMPONENTS = ("loss_spike", "grad_norm_growth", "skipped_step_fraction", "activation_pressure")
#: Every term name a stored trial may carry.
STORED_COMPONENTS = tuple(dict.fromkeys((*RECORDED_COMPONENTS, *LEGACY_COMPONENTS)))

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
#: foretells (``benchmarks/stability/probe_schedule.py``: AUC 0.86 every 4 steps, 0.62 every 16).
PROBE_COST = 0.4

#: The probe loss at this multiple of its value before the first step (or non-finite) is a divergence once it stays
#: there: at the next probe, or at the last probe of the run. Measured against the start, not the best value: a run
#: that learned and then lost part of it is unstable (scored by :func:`probe_rebound`) but has not diverged. In
#: ``benchmarks/stability/results/validity.md`` configuration 4 went from its best 2.06 to 7.60 (1.67x its start) at one
#: probe, fell back at the next and completed 300 steps at 0.79x its start, while every run that failed ended at
#: 1.7-7.4x.
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
