"""The ``json`` export (and the ``.json`` the ``hf`` export writes beside its ``.py``): the settings as JSON."""

from __future__ import annotations

import json
from typing import Any

from sweeper.export._dataset import ExportData
from sweeper.export._format import ExportFormat
from sweeper.export._settings import ExportSettings


def settings_json(s: ExportSettings) -> dict[str, Any]:
    """The settings as JSON: ``{"provenance", "notes", "model", "max_seq_length", "collation", "environment",
    "bnb_config", "lora_config", "training_args", "effective_batch_size", "target_effective_batch_size"}``;
    ``collation`` is ``{"packing", "attn_implementation"}`` (:class:`~sweeper.export._settings.CollationSettings`),
    ``environment`` the variables the run sets (``{"PYTORCH_CUDA_ALLOC_CONF": ...}`` or ``{}``:
    :func:`~sweeper.export._settings.run_environment`)."""
    return {
        "provenance": s.provenance.to_dict(),
        "notes": s.notes,
        "model": s.model,
        "max_seq_length": s.max_seq_length,
        "collation": s.collation.to_dict(),
        "environment": dict(s.environment),
        "bnb_config": s.quantization.to_dict(),
        "lora_config": s.lora.to_dict(),
        "training_args": s.training.to_dict(),
        "effective_batch_size": s.effective_batch_size,
        "target_effective_batch_size": s.target_effective_batch_size,
    }


def render_json(s: ExportSettings) -> str:
    """The JSON file's text: :func:`settings_json`, indented."""
    return json.dumps(settings_json(s), indent=2) + "\n"


def _files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The JSON file."""
    return {".json": render_json(s)}


JSON = ExportFormat(
    name="json",
    suffix=".json",
    help="the settings and their provenance (.json)",
    render=_files,
    offered_instead=False,
)
