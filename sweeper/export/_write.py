"""Writing an export: the files of each format (:func:`render`), where ``-o PATH`` puts them (:func:`export_path`),
and the write itself, each file renamed into place (:func:`write_export`)."""

from __future__ import annotations

import hashlib
import json
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


#: Beside the exports (one per folder): the sha256 of each file ``sweep export`` wrote there, by name, so that a file
#: edited since is never replaced without ``--force``.
MANIFEST = ".sweeper-exports.json"


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _manifest(folder: Path) -> dict[str, str]:
    """The study's :data:`MANIFEST` (empty when there is none or it cannot be read)."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return (
        {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}
    )


def _refuse_edited(targets: dict[Path, str], written: dict[str, str]) -> None:
    """Raise when a target exists with content ``sweep export`` did not write there (edited since, or another
    tool's file), unless it is already what would be written."""
    for target, text in targets.items():
        if not target.is_file():
            continue
        current = _sha256(target.read_bytes())
        if current in (written.get(target.name), _sha256(text)):
            continue
        raise StudyError(
            f"{target}: -o: the file was changed since 'sweep export' wrote it (or sweep did not write it); pass "
            "--force to replace it, or -o another path to keep both"
        )


def write_export(
    study: optuna.Study, trial: StoredTrial, fmt: Format, path: str | Path, force: bool = False
) -> list[Path]:
    """Write the export of ``trial`` in ``fmt`` to ``path`` (see :func:`export_path`; ``hf`` also writes the JSON
    beside the ``.py``). Each file is written to a temporary name and renamed, so an existing export is never left
    half-written. An existing file is replaced only when it is as an earlier ``sweep export`` wrote it (its sha256
    is in the folder's :data:`MANIFEST`), or with ``force``: an edited export is never lost.

    Returns:
        The files written.

    Raises:
        StudyError: The path has the wrong suffix, the folder cannot be written, or a file there was edited (without
            ``force``).
    """
    files = render(settings_of(study, trial), fmt)
    base = export_path(path, fmt, f"trial{trial.number}-{fmt}")
    targets = {(base if suffix == SUFFIXES[fmt] else base.with_suffix(suffix)): text for suffix, text in files.items()}
    folder = base.parent
    written = _manifest(folder)
    if not force:
        _refuse_edited(targets, written)
    out = []
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for target, text in targets.items():
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
            out.append(target)
            written[target.name] = _sha256(text)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(written, indent=1, sort_keys=True))
        os.replace(tmp, folder / MANIFEST)
    except OSError as exc:
        raise StudyError(f"{base}: -o: cannot write the export ({exc.strerror}); choose a writable path") from None
    return out
