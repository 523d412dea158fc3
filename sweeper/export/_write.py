"""Writing an export: the files of each format (:func:`render`), where ``-o PATH`` puts them (:func:`export_path`),
and the write itself, each file renamed into place (:func:`write_export`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from sweeper.errors import StudyError
from sweeper.export._dataset import ExportData, export_data
from sweeper.export._registry import export_format
from sweeper.export._settings import ExportSettings, settings_of
from sweeper.study import StoredTrial, StudySnapshot


def render(s: ExportSettings, fmt: str, data: ExportData | None = None) -> dict[str, str]:
    """The files of one export in the format named ``fmt`` (:attr:`~sweeper.export._format.ExportFormat.render`):
    ``{suffix: text}`` (``hf`` writes ``.py`` and ``.json``, the others one file), and for axolotl and LLaMA-Factory
    with ``data`` the trial's rows (and LLaMA-Factory's registry of them), keyed by their path in ``data.folder``.

    Raises:
        ValueError: No format is named ``fmt``.
    """
    return export_format(fmt).render(s, data)


def export_path(path: str | Path, fmt: str, default_name: str) -> Path:
    """Where ``-o PATH`` puts an export: PATH itself (its suffix must be the format's, or none: then it is added);
    inside PATH when it is a folder or ends with ``/``, as ``default_name``.

    Raises:
        StudyError: PATH has another suffix (``.txt`` for a YAML export), is ``-`` (an export is files, not a stream)
            or names something that is neither a regular file nor a folder (``/dev/null``).
        ValueError: No format is named ``fmt``.
    """
    suffix = export_format(fmt).suffix
    text = str(path)
    base = Path(path)
    if text == "-":  # not stdout: an export is files (its config, and beside it the rows or the settings' JSON)
        raise StudyError(f"-: -o: an export is files, not a stream; give a file path ending in {suffix}, or a folder")
    if base.exists() and not base.is_dir() and not base.is_file():  # /dev/null became /dev/null.json
        raise StudyError(
            f"{path}: -o: not a regular file or a folder; give a file path ending in {suffix}, or a folder"
        )
    if text.endswith(("/", os.sep)) or base.is_dir() or base.name in ("", ".", ".."):
        return base / (default_name + suffix)
    if base.suffix and base.suffix.lower() not in (suffix, ".yml" if suffix == ".yaml" else suffix):
        raise StudyError(
            f"{path}: -o: the {fmt} export is a {suffix} file; give a path ending in {suffix}, or a folder"
        )
    return base if base.suffix else base.with_name(base.name + suffix)


#: The last line of a ``.py`` or ``.yaml`` export, and the last key of a JSON one: the sha256 of the rest of the file
#: as ``sweep export`` wrote it, so that a file edited since is never replaced without ``--force``.
STAMP_KEY = "sweeper_sha256"
_COMMENT_STAMP = re.compile(r"# sweeper-sha256: ([0-9a-f]{64})\n\Z")
_JSON_STAMP = re.compile(r',\n  "sweeper_sha256": "([0-9a-f]{64})"\n}\n\Z')


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stamped(text: str, suffix: str) -> str:
    """``text`` with its :data:`STAMP_KEY`: a last comment line (``.py``, ``.yaml``), or a last key of the JSON
    object (``json.dumps(..., indent=2)`` output, which ends in ``\n}\n``)."""
    digest = _sha256(text)
    if suffix == ".json":
        return text.removesuffix("\n}\n") + f',\n  "{STAMP_KEY}": "{digest}"\n}}\n'
    return text + f"# sweeper-sha256: {digest}\n"


def as_written(text: str) -> bool:
    """Whether ``text`` is a file as ``sweep export`` wrote it: its stamp matches the rest (False when it was edited,
    or carries no stamp: another tool's file, or an export of a version before the stamp)."""
    for pattern, restore in ((_COMMENT_STAMP, lambda body: body), (_JSON_STAMP, lambda body: body + "\n}\n")):
        found = pattern.search(text)
        if found is not None:
            return _sha256(restore(text[: found.start()])) == found.group(1)
    return False


def _refuse_edited(targets: dict[Path, str], main: Path) -> None:
    """Raise when a target exists but is not as ``sweep export`` wrote it (edited since, or another tool's file),
    unless it already holds what would be written. A data file (no stamp of its own) is as written when the existing
    ``main`` file, itself as written, names its sha256 (the rows' digest in the dataset entry's comment)."""
    previous = main.read_text(errors="replace") if main.is_file() else ""
    previous = previous if as_written(previous) else ""
    for target, text in targets.items():
        if not target.is_file():
            continue
        current = target.read_text(errors="replace")
        if as_written(current) or current == text or (target != main and _sha256(current) in previous):
            continue
        raise StudyError(
            f"{target}: the file was changed since 'sweep export' wrote it (or sweep did not write it); pass "
            "--force to replace it, or -o another path to keep both"
        )


def write_export(
    study: StudySnapshot,
    trial: StoredTrial,
    fmt: str,
    path: str | Path,
    force: bool = False,
    warnings: list[str] | None = None,
) -> list[Path]:
    """Write the export of ``trial`` in ``fmt`` to ``path`` (see :func:`export_path`; ``hf`` also writes the JSON
    beside the ``.py``). Each file is written to a temporary name and renamed, so an existing export is never left
    half-written. Each file ends with its :data:`STAMP_KEY`; an existing file is replaced only when it is as an
    earlier ``sweep export`` wrote it, or with ``force``: an edited export is never lost.

    axolotl and LLaMA-Factory exports also write the trial's rows into a folder beside the file
    (:func:`sweeper.export._dataset.data_folder`: ``rows.jsonl``, and LLaMA-Factory's ``dataset_info.json``), which
    the file's dataset entry names; when the rows cannot be read here, the file says why and ``warnings`` gets the
    line.

    Returns:
        The files written.

    Raises:
        StudyError: The path has the wrong suffix, the folder cannot be written, or a file there was edited (without
            ``force``).
        ValueError: No format is named ``fmt``.
    """
    form = export_format(fmt)
    settings = settings_of(study, trial)
    base = export_path(path, fmt, f"trial{trial.number}-{fmt}")
    data = export_data(trial.config, study.model_path, base) if form.rows and trial.config is not None else None
    if data is not None and data.rows is None and warnings is not None:
        warnings.append(data.missing_note())
    targets = {}
    for key, text in form.render(settings, data).items():
        if key.startswith("."):
            targets[base if key == form.suffix else base.with_suffix(key)] = stamped(text, key)
        elif key.startswith("_"):  # a file beside named after the main one (the policy's "_test.py")
            targets[base.with_name(base.stem + key)] = stamped(text, key)
        else:  # the rows and their registry: data the user may edit too, compared whole (no stamp in a data file)
            targets[Path(key)] = text
    if not force:
        _refuse_edited(targets, base)
    out = []
    try:
        for target, text in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
            out.append(target)
    except OSError as exc:
        raise StudyError(f"{base}: -o: cannot write the export ({exc.strerror}); choose a writable path") from None
    return out
