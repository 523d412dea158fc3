"""Instability: one number from a short run's per-step trace, higher = closer to divergence.

Pure (no torch import): it runs on the JSON trace a worker returns, so it tests in milliseconds on synthetic traces
and can be recomputed for stored trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

#: Names of the terms of :func:`compute_instability`, in order; each is stored on every trial (None when not measured).
COMPONENTS = ("loss_spike", "grad_norm_growth", "skipped_step_fraction", "activation_pressure")

#: Largest finite value of each compute dtype (``torch.finfo(dtype).max``; IEEE 754 binary16/binary32, bfloat16).
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}

#: Steps of loss history a spike is measured against (a median over them, so one noisy batch does not set the base).
SPIKE_WINDOW = 5

#: Headroom, in bits (powers of two), at which activation pressure reaches 0. 16 bits is fp16's whole range above 1
#: (65504 < 2**16): an activation of magnitude 1 has no pressure, one of 256 has 0.5, one at the dtype's max has 1.
HEADROOM_SCALE_BITS = 16.0


@dataclass(frozen=True, kw_only=True)
class InstabilityComponents:
    """The terms of :func:`compute_instability`, each dimensionless and >= 0.

    Attributes:
        loss_spike: Largest relative rise of the loss over the median of the ``SPIKE_WINDOW`` steps before it.
        grad_norm_growth: Doublings of the gradient norm from the first third of the run to the last, floored at 0.
        skipped_step_fraction: Share of optimizer steps the fp16 loss scaler skipped, in [0, 1].
        activation_pressure: How close the largest activation came to the compute dtype's largest finite value,
            in [0, 1]; 0 for float32 compute.
        instability: Their sum.
    """

    loss_spike: float
    grad_norm_growth: float
    skipped_step_fraction: float
    activation_pressure: float
    instability: float

    def to_dict(self) -> dict[str, float]:
        """The fields as a plain dict."""
        return asdict(self)


def _finite(xs: Sequence[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def loss_spike(loss: Sequence[float | None], window: int = SPIKE_WINDOW) -> float:
    """Largest ``L_t / median(L_{t-window}..L_{t-1}) - 1`` over the run, floored at 0.

    Why: loss spikes are the first visible sign of an unstable run; they precede divergence in large-scale training
    (Chowdhery et al. 2022, PaLM, sec. 5.1; Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
    training instabilities"). The median base keeps one easy batch from making the next ordinary one a spike.

    Args:
        loss: Raw loss per optimizer step (non-finite and None entries are skipped).
        window: History length the base median is taken over, >= 1.
    """
    xs = _finite(loss)
    worst = 0.0
    for t in range(1, len(xs)):
        base = statistics.median(xs[max(0, t - window) : t])
        if base > 0:
            worst = max(worst, xs[t] / base - 1.0)
    return worst


def grad_norm_growth(grad_norm: Sequence[float | None]) -> float:
    """``max(0, log2(median(last third) / median(first third)))`` of the pre-clip gradient norm.

    Why: a healthy fine-tune's gradient norm is flat or falls; a norm that keeps growing is the optimiser running
    away (too large a step: learning rate times the adapter scale ``lora_alpha / r``), and clipping hides it from
    the loss until the run diverges (Wortsman et al. 2023, sec. 3). Fewer than 3 finite values give 0.
    """
    xs = _finite(grad_norm)
    if len(xs) < 3:
        return 0.0
    third = max(1, len(xs) // 3)
    early, late = statistics.median(xs[:third]), statistics.median(xs[-third:])
    if early <= 0 or late <= 0:
        return 0.0
    return max(0.0, math.log2(late / early))


def skipped_step_fraction(skipped: Sequence[bool], steps: int) -> float:
    """Share of optimizer steps the fp16 loss scaler skipped.

    Why: ``torch.amp.GradScaler`` skips a step whenever the scaled gradients overflow; a few skips at the start are
    its calibration, a steady rate means fp16 gradients live at the edge of their range. 0 when ``steps`` is 0.
    """
    return sum(1 for s in skipped if s) / steps if steps > 0 else 0.0


def activation_pressure(max_activation: Sequence[float | None], compute_dtype: str) -> float:
    """``clip(1 - headroom_bits / HEADROOM_SCALE_BITS, 0, 1)``, ``headroom_bits = log2(dtype_max / max|activation|)``.

    Why: in fp16 an activation past 65504 becomes inf and the loss NaN; the headroom left to that limit measures how
    near a configuration is to it before it happens. bfloat16 shares float32's exponent range, so its pressure is
    ~0 unless activations are astronomically large; float32 compute is not mixed precision and scores 0.

    Args:
        max_activation: Largest absolute output of the 4-bit layers (which compute in ``compute_dtype``) per step.
        compute_dtype: ``bfloat16``, ``float16`` or ``float32``.
    """
    if compute_dtype == "float32":
        return 0.0
    values = [x for x in max_activation if x is not None]
    if not values:
        return 0.0
    peak = max(values)
    if not math.isfinite(peak):
        return 1.0
    if peak <= 0:
        return 0.0
    headroom_bits = math.log2(DTYPE_MAX[compute_dtype] / peak)
    return min(1.0, max(0.0, 1.0 - headroom_bits / HEADROOM_SCALE_BITS))


def compute_instability(
    *,
    loss: Sequence[float | None],
    grad_norm: Sequence[float | None],
    skipped: Sequence[bool] = (),
    max_activation: Sequence[float | None] = (),
    compute_dtype: str = "float32",
) -> InstabilityComponents:
    """Instability of a short run: ``loss_spike + grad_norm_growth + skipped_step_fraction + activation_pressure``.

    Each term is dimensionless and 0 for a perfectly calm run; see each function for its formula and reason. The
    terms are summed unweighted so that each reads directly: 0.5 is "the loss jumped 50%", or "the gradient norm
    grew by 2**0.5", or "half the steps were skipped", or "activations used half of fp16's range above 1".
    Non-finite entries (the failing step of a NaN trial) are ignored, so a pruned trial still gets its components.

    Args:
        loss: Raw training loss per optimizer step, length = steps.
        grad_norm: Gradient norm before clipping per optimizer step, same length.
        skipped: Per step, whether the fp16 loss scaler skipped it (empty when there is no scaler).
        max_activation: Per step, the largest |output| of the 4-bit layers.
        compute_dtype: ``bfloat16``, ``float16`` or ``float32``.

    Raises:
        ValueError: ``compute_dtype`` is not one of the three.
    """
    if compute_dtype not in DTYPE_MAX:
        raise ValueError(f"compute_dtype must be one of {sorted(DTYPE_MAX)}, but got {compute_dtype!r}")
    parts = {
        "loss_spike": loss_spike(loss),
        "grad_norm_growth": grad_norm_growth(grad_norm),
        "skipped_step_fraction": skipped_step_fraction(skipped, len(loss)),
        "activation_pressure": activation_pressure(max_activation, compute_dtype),
    }
    return InstabilityComponents(**parts, instability=sum(parts.values()))
