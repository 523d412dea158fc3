"""A study's storage as the commands open it: for writing (``sweep run``: the URL checked, the study's folder checked
against its owner before anything is created, the folder claimed once the study exists, and what a refused run
created removed again), and for reading (``sweep report``/``export``/``dashboard``: the study a command's STUDY names,
found in its storage without creating anything). Below :mod:`sweeper.study`, which opens the Optuna study on what
these return.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import optuna

from sweeper.errors import SpaceError, StudyError
from sweeper.storage._attrs import StudyAttr
from sweeper.storage._coordination import heartbeat_interval_s, in_memory, sqlite_file, storage_file
from sweeper.storage._identity import OWNER_FILE, check_study_dir, study_dir, study_identity, write_owner
from sweeper.storage._journal import journal_file
from sweeper.storage._open import open_storage, read_storage, storage_url_of
from sweeper.storage._optuna_private import storage_of
from sweeper.storage._urls import redact_url


def check_storage_url(url: str, name: str) -> None:
    """What ``sweep run`` refuses before it touches the storage: a bad ``SWEEPER_HEARTBEAT_INTERVAL_S``, and an
    in-memory storage (the sweep would keep nothing).

    Raises:
        StudyError: The heartbeat setting is not a whole number of seconds in range.
        SpaceError: ``study.storage`` is in memory (one line with the file to keep the study in instead).
    """
    heartbeat_interval_s()
    if in_memory(url):
        raise SpaceError(
            f"{redact_url(url)}: study.storage: an in-memory database keeps nothing after the run (no report, no "
            f"export, no resume); keep the study in a file: leave --storage out (sqlite:///studies/{name}.db) or give "
            f"--storage sqlite:///studies/{name}.db"
        )


def open_for_writing(name: str, url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url``, opened (a storage that cannot be opened is the first thing to say), after checking that
    ``studies/<name>/`` does not hold another study's trials (:func:`check_study_dir`, before anything is created);
    a refused command leaves no new empty database or journal (or its locks) behind.

    Raises:
        StudyError: The storage cannot be opened, or the folder belongs to another study.
    """
    database = storage_file(url)
    fresh = database is not None and not Path(database).exists()
    opened = open_storage(url)
    existing = None
    if name in optuna.get_all_study_names(opened):
        existing = optuna.load_study(study_name=name, storage=opened)
    try:
        check_study_dir(
            name, url, study_identity(existing) if existing is not None else None, exists=existing is not None
        )
    except StudyError:
        if fresh and database is not None:
            for leftover in (Path(database), Path(f"{database}.lock"), Path(f"{database}.ask.lock")):
                leftover.unlink(missing_ok=True)
        raise
    return opened


def claim_study(study: optuna.Study, url: str) -> None:
    """Give a study opened by :func:`open_for_writing` its identity (:data:`StudyAttr.STUDY_ID`, a new UUID for a study
    without one) and make ``studies/<name>/`` its folder (:func:`write_owner`; the folder was checked before the
    study was created).

    Raises:
        StudyError: The folder cannot be written.
    """
    identity = study_identity(study)
    if identity is None:
        identity = uuid.uuid4().hex
        study.set_user_attr(StudyAttr.STUDY_ID, identity)
    write_owner(study.study_name, url, identity)


@dataclass(frozen=True)
class BeforeRun:
    """What existed before a ``sweep run`` opened its study (:meth:`of`), so that a refused run removes what it
    created (:meth:`forget`) and leaves nothing ``sweep report`` would list.

    Attributes:
        url: The storage URL.
        name: The study's name.
        database: Whether the SQLite file of ``url`` existed (False for other storages).
        folder: Whether ``studies/<name>/`` existed.
    """

    url: str
    name: str
    database: bool
    folder: bool

    @classmethod
    def of(cls, url: str, name: str) -> BeforeRun:
        """What exists now of the study ``name`` in ``url``: its SQLite file and its folder."""
        database = sqlite_file(url)
        return cls(url, name, database is not None and Path(database).exists(), study_dir(name).exists())

    def forget(self, study: optuna.Study | None) -> None:
        """Undo what the refused run created: ``study`` (the study it created; None when it created none), a database
        file and a study folder (holding no more than its owner file) that were not there before."""
        if study is not None:
            try:
                optuna.delete_study(study_name=self.name, storage=storage_of(study))
            except Exception:  # the refusal is what the user needs to see; a leftover empty study is harmless
                return
        database = sqlite_file(self.url)
        if study is not None and database is not None and not self.database:
            for leftover in (Path(database), Path(f"{database}.lock")):
                leftover.unlink(missing_ok=True)
        folder = study_dir(self.name)
        if not self.folder and folder.is_dir() and {p.name for p in folder.iterdir()} <= {OWNER_FILE}:
            shutil.rmtree(folder, ignore_errors=True)


def locate_study(ref: str) -> tuple[optuna.storages.BaseStorage, str, str]:
    """The study a reading command names (:func:`storage_url_of`): a study name (``studies/<name>.db``, or the storage
    its folder names), a ``.db`` or journal ``.log`` path, or a storage URL; a path or URL must hold exactly one study
    or name one after a ``#`` (``journal:///night.log#night-2``). Nothing is created.

    Returns:
        ``(storage, study_name, storage_url)``: the storage opened for reading, the study's name in it, its URL.

    Raises:
        StudyError: No such study file or study, or the storage holds several studies (their names are listed).
    """
    url, name = storage_url_of(ref)
    storage, names = read_storage(url)
    if name is None:
        if len(names) != 1:
            raise StudyError(
                f"{redact_url(url)}: STUDY: holds {len(names)} studies ({', '.join(names) or 'none'}); "
                f"give one after a '#' ('sweep report {redact_url(url)}#{names[0] if names else 'NAME'}'), or by name "
                f"alone in the folder its sweep ran in (its studies/NAME/{OWNER_FILE} says where the study is)"
            )
        return storage, names[0], url
    if name not in names:
        # a database file renamed or copied under another name still holds the study of its first name: its path
        # reads that one (issue 55)
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else journal_file(url)
        by_path = f"; its path reads the one it holds: 'sweep report {path}'" if path and len(names) == 1 else ""
        raise StudyError(
            f"{redact_url(url)}: STUDY: no study '{name}' in it (it holds {', '.join(names) or 'none'}){by_path}"
        )
    return storage, name, url
