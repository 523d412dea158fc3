"""Where a study's files live and whose they are: ``studies/<name>/`` (trials, artifacts, report, exports), the
study's identity (a UUID stored on it, travelling with the database), and the owner file that keeps two studies of
one name from writing over each other's folders."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import optuna

from sweeper.errors import StudyError
from sweeper.storage._attrs import StudyAttr
from sweeper.storage._coordination import in_memory, sqlite_file
from sweeper.storage._machine import check_writable
from sweeper.storage._urls import redact_url

#: Root of studies and their artifacts, relative to the working directory (``docs/contract.md``).
STUDIES_DIR = Path("studies")


def default_storage(name: str) -> str:
    """``sqlite:///studies/<name>.db`` (relative to the working directory)."""
    return f"sqlite:///{STUDIES_DIR / (name + '.db')}"


def trial_dir(study_name: str, number: int) -> Path:
    """``studies/<study>/trials/<number>/``: the trial's config, result, worker log and artifacts."""
    return study_dir(study_name) / "trials" / str(number)


def study_dir(study_name: str) -> Path:
    """``studies/<study>/``: the study's trials, artifacts, report and exports. A name that is not a plain file name
    (a study made outside sweeper may be called ``../x``) is made one, so nothing is written outside ``studies/``."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", study_name):
        return STUDIES_DIR / study_name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name).strip("._")[:80] or "study"
    return STUDIES_DIR / f"{safe}-{hashlib.sha256(study_name.encode()).hexdigest()[:8]}"


#: The file in a study's folder that names the study whose trials, artifacts and exports it holds.
OWNER_FILE = "study.json"


def study_identity(study: optuna.Study) -> str | None:
    """The study's :data:`StudyAttr.STUDY_ID`, or None for a study written before identities (or not by sweeper)."""
    raw = study.user_attrs.get(StudyAttr.STUDY_ID)
    return raw if isinstance(raw, str) and raw else None


def _identity(url: str, study_id: str | None = None) -> dict[str, Any]:
    """What :data:`OWNER_FILE` records: the study's identity, the storage without its password, and a SQLite file's
    real path (read only for owner files written before identities)."""
    database = sqlite_file(url)
    return {
        "study_id": study_id,
        "storage": redact_url(url),
        "sqlite_file": os.path.realpath(database) if database is not None else None,
    }


def _owner(study_name: str, folder: Path | None = None) -> dict[str, Any] | None:
    """What ``studies/<study_name>/``'s :data:`OWNER_FILE` says (or ``folder``'s); for a folder without one (written
    by sweeper 0.1, before owner files), the owner its layout implies (:func:`_implied_owner`); else None."""
    folder = folder or study_dir(study_name)
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except FileNotFoundError:
        return _implied_owner(study_name, folder)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _implied_owner(study_name: str, folder: Path) -> dict[str, Any] | None:
    """The owner of a study folder without an :data:`OWNER_FILE` (sweeper 0.1 wrote none): the SQLite file beside it
    of its name (``studies/<name>.db`` beside ``studies/<name>/``, the layout ``sweep run`` makes), when both are
    there; else None (nothing says whose the folder is). Without it, a 0.1 study's database copied beside itself
    (``studies/<name>-copy.db``) would write trial folders into the original's, and its dashboard would open from
    any folder."""
    database = folder.parent / f"{folder.name}.db"
    if not folder.is_dir() or not database.is_file():
        return None
    return {
        "study": study_name,
        "study_id": None,
        "storage": f"sqlite:///{database}",
        "sqlite_file": os.path.realpath(database),
    }


def _same_study(owner: dict[str, Any], url: str, study_id: str | None) -> bool:
    """Whether ``owner`` (an :data:`OWNER_FILE`'s content) names this study: the same identity when the owner file
    has one; for an owner file written before identities, the same SQLite file by its real path, else the same URL
    without its password."""
    theirs = owner.get("study_id")
    if isinstance(theirs, str) and theirs:
        return theirs == study_id
    mine = _identity(url)
    other = owner.get("sqlite_file")
    return other == mine["sqlite_file"] if isinstance(other, str) else owner.get("storage") == mine["storage"]


def _copy_conflict(study_name: str, owner: dict[str, Any], url: str, option: str = "--storage") -> str | None:
    """A line when this database is a copy of the folder owner's (the same identity in another SQLite file) and the
    owner's file is still there inside this project folder: from their first new trial on, the two would write trial
    N's folder over each other. A copied project folder (the owner's file lies outside this folder) is not one: its
    copy takes the folder over."""
    theirs, mine = owner.get("sqlite_file"), _identity(url)["sqlite_file"]
    if not isinstance(theirs, str) or mine is None or theirs == mine or not Path(theirs).is_file():
        return None
    here = os.path.realpath(os.getcwd())
    if os.path.commonpath([here, theirs]) != here:
        return None
    return (
        f"{redact_url(url)}: {option}: this database is a copy of study '{study_name}' in {theirs}, whose trials, "
        f"artifacts and exports are in {study_dir(study_name)}/; run in this folder, the two would write trial "
        "folders of the same numbers over each other; run the copy from another folder (copy the whole project "
        "folder), or keep using the original"
    )


def _owner_conflict(
    study_name: str, url: str, study_id: str | None, option: str = "--storage", exists: bool = False
) -> str | None:
    """A line saying that ``studies/<study_name>/`` belongs to another study of that name, or None.

    It does when its :data:`OWNER_FILE` names another study (:func:`_same_study`) that may still exist: one in a
    SQLite file that is still there, or in any other database. An owner file naming a SQLite file that is gone
    (deleted) is not a conflict: that study's trials can no longer be read anyway, and the folder is taken over.
    """
    owner = None if in_memory(url) else _owner(study_name)
    if owner is None:
        return None
    if _same_study(owner, url, study_id):
        return _copy_conflict(study_name, owner, url, option)
    other = owner.get("sqlite_file")
    theirs = owner.get("study_id")
    if isinstance(other, str) and not Path(other).is_file():
        return None
    them = f"'{study_name}'" + (f" (id {str(theirs)[:8]})" if theirs else "")
    me = (
        f" (id {study_id[:8]})"
        if study_id
        else " (written by sweeper 0.1, without an id)"
        if exists
        else " (a new study)"
    )
    return (
        f"{redact_url(url)}: {option}: {study_dir(study_name)}/ holds the trials, artifacts and exports of another "
        f"study {them} in {owner.get('storage', 'another storage')}, not of this one{me}; give this one another name "
        "(sweep run --study NAME), or run it from another folder, so that neither overwrites the other's files"
    )


def write_owner(study_name: str, url: str, study_id: str | None) -> None:
    """Make ``studies/<study_name>/`` the folder of this study: write its :data:`OWNER_FILE` unless it already names
    this study in this storage, so that another study of the same name cannot write its trial folders over this
    one's (trial numbers start at 0 in each). A copy of the study (the same identity in another database) updates the
    storage it names. Call after :func:`check_study_dir`; nothing is written for an in-memory storage.

    Raises:
        StudyError: The folder cannot be written.
    """
    owner = _owner(study_name)
    mine = {"study": study_name, **_identity(url, study_id)}
    if in_memory(url) or (owner is not None and all(owner.get(k) == v for k, v in mine.items())):
        return
    folder = study_dir(study_name)
    path = folder / OWNER_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{OWNER_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(mine, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise StudyError(
            f"{folder}: cannot write the study's folder ({exc.strerror or exc}); run from a folder you can write, "
            "or fix its permissions"
        ) from None


def check_study_dir(
    study_name: str, url: str, study_id: str | None = None, option: str = "--storage", exists: bool = False
) -> None:
    """Refuse to write ``studies/<study_name>/`` (trials, artifacts, report, exports) for the study ``study_id`` in
    ``url`` (None: a study not created yet) when the folder belongs to another study of that name (its
    :data:`OWNER_FILE`); writes nothing. ``sweep run`` and ``sweep confirm`` call it; reading commands do not.
    ``option`` is what the user named the storage with, for the message (``--storage``, or ``STUDY``); ``exists``:
    the study is in ``url`` already (without ``study_id``: one sweeper 0.1 wrote).

    Raises:
        StudyError: One line naming both studies, their storages and identities, and the fix.
    """
    conflict = _owner_conflict(study_name, url, study_id, option, exists)
    if conflict:
        raise StudyError(conflict)


def _home_elsewhere(study_name: str, url: str, study_id: str | None) -> str | None:
    """A line when the study's SQLite file lies beside its own folder (``<dir>/<study_name>/`` whose
    :data:`OWNER_FILE` names this study, as ``sweep run`` lays them out: ``studies/demo.db`` and ``studies/demo/``)
    and that folder is not this working directory's ``studies/<study_name>/``: a command run from another folder
    would write the study's files apart from its trials."""
    database = sqlite_file(url)
    if database is None:
        return None
    home = Path(os.path.realpath(database)).parent / study_name
    owner = _owner(study_name, home)
    if owner is None or not _same_study(owner, url, study_id):
        return None
    if os.path.realpath(study_dir(study_name)) == str(home):
        return None
    project = home.parent.parent if home.parent.name == "studies" else home.parent
    return (
        f"{redact_url(url)}: study '{study_name}' keeps its trials, artifacts and exports in {home}/, not in this "
        f"folder's {study_dir(study_name)}/; run this command from {project} (cd {shlex.quote(str(project))}), so "
        "that its files stay together"
    )


def check_study_owner(study: optuna.Study, url: str) -> None:
    """Whether ``sweep confirm`` (and ``calibrate``, and ``report``/``export`` writing into the study's folder) may
    write into the opened study's folder: :func:`check_study_dir` (it belongs to no other study of that name), the
    study's own folder is not elsewhere (:func:`_home_elsewhere`: run from another folder, its files would be split),
    and the folder can be created and written (:func:`sweeper.storage._machine.check_writable`), before anything runs.

    Raises:
        StudyError: ``studies/<name>/`` belongs to another study of that name, the study's folder is beside its
            database in another folder, or the folder cannot be written.
    """
    study_id = study_identity(study)
    check_study_dir(
        study.study_name, url, study_id, option="STUDY", exists=True
    )  # the commands that call this name it STUDY
    elsewhere = _home_elsewhere(study.study_name, url, study_id)
    if elsewhere:
        raise StudyError(elsewhere)
    check_writable(study_dir(study.study_name))
