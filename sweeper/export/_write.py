"""Writing an export: the files of each format (:func:`render`), where ``-o PATH`` puts them (:func:`export_path`),
and the write itself, each file renamed into place (:func:`write_export`)."""

from __future__ import annotations

import os
from pathlib import Path

import optuna

from sweeper.errors import StudyError
from sweeper.export._axolotl import render_axolotl
from sweeper.export._hf import render_hf
from sweeper.export._json import render_json
from sweeper.export._llama_factory import render_llama_factory
from sweeper.export._pick import Format
from sweeper.export._settings import ExportSettings, settings_of
from sweeper.study import StoredTrial


def render(s: ExportSettings, fmt: Format) -> dict[str, str]:
    """The files of one export: ``{suffix: text}`` (``hf`` writes ``.py`` and ``.json``, the others one file)."""
    if fmt == "hf":
        return {".py": render_hf(s), ".json": render_json(s)}
    if fmt == "trl":
        return {".py": render_hf(s, trl=True)}
    if fmt == "axolotl":
        return {".yaml": render_axolotl(s)}
    if fmt == "llama-factory":
        return {".yaml": render_llama_factory(s)}
    return {".json": render_json(s)}


#: The suffix of each format's main file.
SUFFIXES = {"hf": ".py", "trl": ".py", "axolotl": ".yaml", "llama-factory": ".yaml", "json": ".json"}


def export_path(path: str | Path, fmt: Format, default_name: str) -> Path:
    """Where ``-o PATH`` puts an export: PATH itself (its suffix must be the format's, or none: then it is added);
    inside PATH when it is a folder or ends with ``/``, as ``default_name``.

    Raises:
        StudyError: PATH has another suffix (``.txt`` for a YAML export).
    """
    suffix = SUFFIXES[fmt]
    text = str(path)
    base = Path(path)
    if text.endswith(("/", os.sep)) or base.is_dir() or base.name in ("", ".", ".."):
        return base / (default_name + suffix)
    if base.suffix and base.suffix.lower() not in (suffix, ".yml" if suffix == ".yaml" else suffix):
        raise StudyError(
            f"{path}: -o: the {fmt} export is a {suffix} file; give a path ending in {suffix}, or a folder"
        )
    return base if base.suffix else base.with_name(base.name + suffix)


def write_export(study: optuna.Study, trial: StoredTrial, fmt: Format, path: str | Path) -> list[Path]:
    """Write the export of ``trial`` in ``fmt`` to ``path`` (see :func:`export_path`; ``hf`` also writes the JSON
    beside the ``.py``). Each file is written to a temporary name and renamed, so an existing export is never left
    half-written.

    Returns:
        The files written.

    Raises:
        StudyError: The path has the wrong suffix, or the folder cannot be written.
    """
    files = render(settings_of(study, trial), fmt)
    base = export_path(path, fmt, f"trial{trial.number}-{fmt}")
    out = []
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for suffix, text in files.items():
            target = base if suffix == SUFFIXES[fmt] else base.with_suffix(suffix)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
            out.append(target)
    except OSError as exc:
        raise StudyError(f"{base}: -o: cannot write the export ({exc.strerror}); choose a writable path") from None
    return out
