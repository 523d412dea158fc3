"""What a trial leaves in the study's artifact store (``studies/<study>/artifacts``, Optuna's
``FileSystemArtifactStore``): its trace as JSON, its loss curve as SVG and, after a NaN, its failing batch; uploaded by
the run loop after each measured trial and shown by optuna-dashboard.
"""

from __future__ import annotations

import html
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from sweeper.storage import study_dir
from sweeper.trial import TrialResult


def artifact_dir(study_name: str) -> Path:
    """``studies/<study>/artifacts``: the study's ``FileSystemArtifactStore``."""
    return study_dir(study_name) / "artifacts"


def artifact_store(study_name: str) -> optuna.artifacts.FileSystemArtifactStore:
    """The study's artifact store (the folder is created)."""
    folder = artifact_dir(study_name)
    folder.mkdir(parents=True, exist_ok=True)
    return optuna.artifacts.FileSystemArtifactStore(str(folder))


def upload_trial_artifacts(
    trial: optuna.Trial | FrozenTrial,
    result: TrialResult,
    folder: Path,
    store: optuna.artifacts.FileSystemArtifactStore,
) -> list[str]:
    """Write ``trace.json`` and ``loss_curve.svg`` into the trial's folder and upload them, with ``nan_batch.jsonl``
    when the trial left one, to ``store``.

    Returns:
        The artifact ids.
    """
    folder.mkdir(parents=True, exist_ok=True)
    trace = {
        "loss": result.constant.loss_trace,
        "grad_norm": result.constant.grad_norm_trace,
        "max_activation": result.constant.max_activation_trace,
        "skipped_steps": result.constant.skipped_steps,
        "supervised_tokens": result.data.supervised_tokens_trace,
    }
    (folder / "trace.json").write_text(json.dumps(trace))
    (folder / "loss_curve.svg").write_text(
        loss_curve_svg(
            result.constant.loss_trace, result.constant.grad_norm_trace, f"trial {trial.number}, {result.status}"
        )
    )
    files = [("trace.json", "application/json"), ("loss_curve.svg", "image/svg+xml")]
    if (folder / "nan_batch.jsonl").is_file():
        files.append(("nan_batch.jsonl", "application/json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return [
            optuna.artifacts.upload_artifact(
                artifact_store=store, file_path=str(folder / name), study_or_trial=trial, mimetype=mime
            )
            for name, mime in files
        ]


def loss_curve_svg(loss: Sequence[float | None], grad_norm: Sequence[float | None], title: str) -> str:
    """A small SVG of a trial's loss and gradient norm per step, for optuna-dashboard's artifact viewer (it previews
    images; plotly's static export needs kaleido and a Chrome binary, which GPU machines often lack).

    Each series is scaled to its own range; a non-finite step is a gap.
    """
    width, height, pad = 480, 200, 30

    def path(values: Sequence[float | None]) -> str:
        finite = [v for v in values if v is not None]
        if not finite:
            return ""
        lo, hi = min(finite), max(finite)
        span = (hi - lo) or 1.0
        n = max(len(values) - 1, 1)
        out, pen = [], "M"
        for i, v in enumerate(values):
            if v is None:
                pen = "M"
                continue
            x = pad + (width - 2 * pad) * i / n
            y = height - pad - (height - 2 * pad) * (v - lo) / span
            out.append(f"{pen}{x:.1f},{y:.1f}")
            pen = "L"
        return " ".join(out)

    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="{pad}" y="18" font-family="sans-serif" font-size="12">{html.escape(title)}: '
        '<tspan fill="#1f77b4">loss</tspan>, <tspan fill="#ff7f0e">gradient norm</tspan> (each on its own scale)'
        f'</text><path d="{path(loss)}" fill="none" stroke="#1f77b4" stroke-width="2"/>'
        f'<path d="{path(grad_norm)}" fill="none" stroke="#ff7f0e" stroke-width="2" stroke-dasharray="4 2"/>'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>'
        f'<text x="{width - pad}" y="{height - 8}" font-family="sans-serif" font-size="11" '
        f'text-anchor="end">step 1-{max(len(loss), 1)}</text></svg>'
    )
