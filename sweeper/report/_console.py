"""The report's shared text pieces: short parameter names, a status's label, a margin's and a prediction's text, a
plain table; the views (``_trial_text``, ``_front_text``, ``_data_text``, ``_memory_text``) build on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeper.notation import format_margin_range, format_rate_range
from sweeper.stability import StabilityFigures, barely_learns
from sweeper.trial import StressOutcome, TrialStatus

#: Short column names of per-trial keys in the console (the full names are in the study and the reports).
SHORT_NAMES = {
    "r": "r",
    "lora_alpha_ratio": "alpha/r",
    "bnb_4bit_compute_dtype": "compute",
    "bnb_4bit_use_double_quant": "dq",
    "bnb_4bit_quant_type": "quant",
    "per_device_train_batch_size": "batch",
    "max_seq_length": "seq",
    "learning_rate": "lr",
    "gradient_accumulation_steps": "ga",
}


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e6 else f"{value:.3g}"
    return str(value)


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def format_params(params: Mapping[str, Any]) -> str:
    """``r=16 alpha/r=2 compute=bfloat16 ...`` in the given order."""
    return " ".join(f"{SHORT_NAMES.get(k, k)}={_fmt(v)}" for k, v in params.items())


def status_label(status: str, nan_cause: str | None) -> str:
    """``nan/data``, ``nan/precision``, ``nan/optimization`` for diagnosed NaN trials, else the status."""
    return f"{status}/{nan_cause}" if status == TrialStatus.NAN and nan_cause else status


#: Width of the status column: the longest status a trial line shows (``nan/optimization``, ``predicted_oom``,
#: ``dominated_oom``), so that the columns after it stay aligned whatever the status.
STATUS_WIDTH = max(
    *(len(s.value) for s in TrialStatus),
    *(len(status_label("nan", cause)) for cause in ("data", "precision", "optimization", "unknown")),
)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def margin_text(stress: StressOutcome | StabilityFigures) -> str:
    """A trial's margin with its seed-noise interval (:func:`sweeper.notation.format_margin_range`), from its stored
    stress phase or a report row's :class:`~sweeper.stability.StabilityFigures`."""
    return format_margin_range(
        stress.stability_margin, stress.margin_capped, stress.stability_margin_low, stress.stability_margin_high
    )


def predicted_text(stress: StressOutcome | StabilityFigures) -> str:
    """``predicted_max_lr`` with its 95% interval and which factor made it: ``3.36e-03 (1.5e-03-7.5e-03;
    uncalibrated: factor from SmolLM2-135M (8 edges, geometric SD 1.51))``; ``-`` when unknown."""
    shown = format_rate_range(stress.predicted_max_lr, stress.predicted_max_lr_low, stress.predicted_max_lr_high)
    if shown == "-" or not stress.predicted_max_lr_source:
        return shown
    if shown.endswith(")"):
        return f"{shown[:-1]}; {stress.predicted_max_lr_source})"
    return f"{shown} ({stress.predicted_max_lr_source})"


def format_progress(progress: float | None, best: float) -> str:
    """A learning progress as a percentage (``21%``), with ``(barely)`` when it is under
    :data:`~sweeper.stability._progress.LEARNING_PROGRESS_SHARE` of ``best`` (the front's, or the study's, largest);
    ``-`` when unknown."""
    if progress is None:
        return "-"
    return f"{100 * progress:.0f}%" + (" (barely)" if barely_learns(progress, best) else "")


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 finished trial``, ``2 finished trials``: ``count`` and ``word``, or ``words`` (default ``word + "s"``) when
    ``count`` is not 1."""
    return f"{count} {word if count == 1 else (words or word + 's')}"
