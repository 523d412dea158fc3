"""Opening an Optuna storage by its URL (SQLite, PostgreSQL, MySQL, a journal file): for a sweep, creating what is
missing under a lock between sweeps; for a reading command, reading what is there and creating nothing; and the
URL a command's STUDY names. One line for every way a storage cannot be opened."""

from __future__ import annotations

import os
from pathlib import Path

import optuna

from sweeper.errors import StudyError
from sweeper.storage._coordination import AskLock, heartbeat_kwargs, sqlite_database, sqlite_file
from sweeper.storage._identity import STUDIES_DIR, _owner, default_storage
from sweeper.storage._journal import JOURNAL_SCHEME, HeartbeatJournalStorage, check_journal, journal_file
from sweeper.storage._urls import redact_url, scrub_secrets

#: The name under which sweeps take the storage-wide lock while one of them creates Optuna's tables.
SCHEMA_LOCK = "\0schema"


def _check_study_file(url: str, path: str, example: str) -> None:
    """Refuse a study file (SQLite database or journal) that is a folder, lies in a folder that is not there (only
    the default ``studies/`` is created) or cannot be written; create ``studies/``.

    Raises:
        StudyError: One line naming the URL and the fix.
    """
    db = Path(path)
    if db.is_dir():
        raise StudyError(f"{url}: study.storage: {db} is a folder; give the path of a file, e.g. {example}")
    if not db.parent.exists() and db.parent.resolve() != STUDIES_DIR.resolve():
        # Only the default studies/ is created: a URL naming another folder that is not there is a typo more
        # often than a wish (sqlite:////nonexistent_dir/x.db would otherwise create /nonexistent_dir).
        raise StudyError(
            f"{url}: study.storage: the folder {db.parent} does not exist; create it (mkdir -p {db.parent}) or "
            "give --storage a path in an existing folder"
        )
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(
            f"{url}: study.storage: cannot create {db.parent} ({exc.strerror}); choose a writable folder with --storage"
        ) from None
    if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
        raise StudyError(f"{url}: study.storage: {db} is not writable; fix its permissions or choose another --storage")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url`` for a sweep (Optuna's ``RDBStorage`` with sweeper's heartbeat, or its journal storage),
    creating the database's tables (one sweep at a time: :data:`SCHEMA_LOCK`), the default ``studies/`` folder and a
    missing file.

    Raises:
        StudyError: The file is a folder, in a folder that is not there, or not writable; the database driver is
            missing; the server cannot be reached; the journal cannot be replayed (its first bad line named).
    """
    heartbeat = heartbeat_kwargs()
    # A long busy timeout: several processes may write one SQLite file (one machine only).
    engine_kwargs = {"connect_args": {"timeout": 60}} if sqlite_database(url) is not None else None
    database = sqlite_file(url)
    if database is not None:
        _check_study_file(url, database, f"sqlite:///{database.rstrip('/')}/study.db")
    journal = journal_file(url)
    if journal is not None:
        _check_study_file(url, journal, f"journal:///{journal.rstrip('/')}/study.log")
        if Path(journal).exists():
            check_journal(url, journal)
        try:
            return HeartbeatJournalStorage(journal, **heartbeat)
        except (ValueError, UnicodeDecodeError, KeyError, AssertionError) as exc:  # a journal Optuna cannot replay
            raise StudyError(_unreadable(url, exc)) from None
    lock = AskLock(url, SCHEMA_LOCK)
    try:
        # Sweeps started together on an empty database would race to create Optuna's tables (a unique violation
        # in PostgreSQL's catalog): one creates them while the others wait.
        with lock.held():
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
            except Exception as exc:
                # Another sweep created the tables at the same moment (CI at 4910dd4: two `sweep run --workers 4` on
                # a new SQLite file, "UNIQUE constraint failed: alembic_version.version_num"): they exist now.
                if type(exc).__name__ != "IntegrityError" or "alembic_version" not in str(exc):
                    raise
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
    except StudyError:
        raise
    except ModuleNotFoundError as exc:
        driver = {
            "psycopg2": "'pip install psycopg2-binary'",
            "psycopg": "'pip install psycopg[binary]' (sweeper's 'postgres' extra)",
            "pymysql": "'pip install pymysql'",
            "MySQLdb": "'pip install mysqlclient', or 'pip install pymysql' and a mysql+pymysql:// URL",
        }.get(exc.name or "", f"'pip install {exc.name}'")
        raise StudyError(
            f"{redact_url(url)}: --storage: the database driver '{exc.name}' is not installed; run {driver}"
        ) from None
    except ImportError as exc:  # optuna's wrapper around a missing driver
        scheme = url.split(":", 1)[0].split("+")[0]
        driver = {"postgresql": "psycopg[binary]", "mysql": "pymysql"}.get(scheme, "the driver of " + scheme)
        raise StudyError(
            f"{redact_url(url)}: --storage: no database driver for '{scheme}' is installed "
            f"({scrub_secrets(str(exc), url)}); run 'pip install {driver}'"
        ) from None
    except Exception as exc:  # sqlalchemy raises ArgumentError, OperationalError, ... for a bad URL or server
        first = scrub_secrets((str(exc).strip().splitlines() or [type(exc).__name__])[0][:160], url)
        raise StudyError(
            f"{redact_url(url)}: --storage: cannot open this storage ({type(exc).__name__}: {first}); "
            "give sqlite:///PATH.db, journal:///PATH.log or a reachable postgresql:// or mysql:// URL"
        ) from None


def _first_bad_line(path: str) -> int | None:
    """The 1-based number of the first line of the journal at ``path`` that Optuna cannot apply (a garbled entry:
    its error names a field inside the entry, not where it is), found by replaying ever longer prefixes of the
    journal into a scratch copy (a bisection: about log2(lines) replays); None when it cannot be found. Only on a
    failure's path."""
    import tempfile

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    try:
        lines = Path(path).read_bytes().splitlines(keepends=True)
    except OSError:
        return None

    def applies(n: int) -> bool:
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / "prefix.log"
            copy.write_bytes(b"".join(lines[:n]))
            try:
                storage = JournalStorage(JournalFileBackend(str(copy)))
                for study in storage.get_all_studies():
                    storage.get_all_trials(storage.get_study_id_from_name(study.study_name), deepcopy=False)
            except Exception:
                return False
        return True

    if applies(len(lines)):
        return None
    low, high = 0, len(lines)  # the first `low` lines apply, the first `high` do not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if applies(middle) else (low, middle)
    # Optuna's file backend skips a last line that is not JSON (a write still under way), so a prefix ending at a
    # garbled line applies and the bisection stops one line late: name the line that is not JSON (issue 68)
    if high >= 2 and not _is_json(lines[high - 2]):
        return high - 1
    return high


def _is_json(line: bytes) -> bool:
    """Whether one journal line parses as JSON."""
    import json

    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _unreadable(url: str, exc: BaseException) -> str:
    """One line for a storage a reading command cannot read, naming which of three causes it is: a server that cannot
    be reached, a file that is not an SQLite database, or a database without Optuna's tables."""
    causes: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(causes) < 8:
        causes.append(seen)
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    text = " ".join(str(c) for c in causes).lower()
    first = scrub_secrets((str(causes[-1]).strip().splitlines() or [type(causes[-1]).__name__])[0][:160], url)
    where = redact_url(url)
    if sqlite_file(url) is None and any(
        word in text for word in ("connection refused", "could not connect", "timeout expired", "name or service")
    ):
        return (
            f"{where}: STUDY: cannot reach the database server ({first}); check the host, the port and that the "
            "server runs (the URL 'sweep run --storage' used)"
        )
    if "file is not a database" in text or "not a database" in text:
        return f"{where}: STUDY: the file is not an SQLite database ({first}); give the .db that 'sweep run' wrote"
    if "no such table" in text or "undefinedtable" in text or "does not exist" in text:
        return (
            f"{where}: STUDY: the database holds no Optuna study (no Optuna tables: an empty or another program's "
            "database); give the .db that 'sweep run' wrote"
        )
    journal = journal_file(url)
    if journal is not None:
        line = _first_bad_line(journal)
        at = f" at line {line}" if line is not None else ""
        return (
            f"{where}: STUDY: cannot read it as an Optuna journal{at} ({first}); give the journal 'sweep run' wrote"
            + (f", or cut line {line} and what follows it from a copy" if line is not None else "")
        )
    return (
        f"{where}: STUDY: cannot read it as an Optuna study database ({type(causes[-1]).__name__}: {first}); "
        "give the .db that 'sweep run' wrote"
    )


def storage_url_of(ref: str) -> tuple[str, str | None]:
    """The storage URL a command's STUDY names, and the study's name when it names one: a URL or a path as given
    (a ``.log`` path is a journal), a study name by ``studies/<name>.db`` or, without it, by the storage its folder's
    ``study.json`` names (a server, a journal, another file). A URL or path may name one study of several in its
    storage after a ``#``: ``journal:///shared/night.log#night-2`` (a URL's own ``#`` is written ``%23``).

    Raises:
        StudyError: A path that is not a file, or a name with neither a database nor a folder that says where it is.
    """
    base, hash_sign, named = ref.rpartition("#")
    if hash_sign and named and ("://" in base or base.endswith((".log", ".db")) or "/" in base):
        return storage_url_of(base)[0], named
    if "://" in ref:
        return ref, None
    if ref.endswith(".log"):  # a journal file, as optuna-dashboard takes it
        return f"{JOURNAL_SCHEME}{ref}", None
    if ref.endswith(".db") or "/" in ref:
        if not Path(ref).is_file():
            raise StudyError(
                f"{ref}: STUDY: no such study file; give a study name (studies/<name>.db), a .db path or a storage URL"
            )
        return f"sqlite:///{ref}", None
    db = STUDIES_DIR / f"{ref}.db"
    if db.is_file():
        return default_storage(ref), ref
    owner = _owner(ref)
    elsewhere = owner.get("storage") if owner is not None else None
    if isinstance(elsewhere, str) and elsewhere != default_storage(ref):
        # the sweep that ran here wrote where its study is (a server, a journal, another file): read it there, by
        # name (the only way to name one of several studies in one storage)
        return elsewhere, ref
    known = sorted(p.stem for p in STUDIES_DIR.glob("*.db")) if STUDIES_DIR.is_dir() else []
    hint = f"studies here: {', '.join(known)}" if known else "run 'sweep run SPACE.yaml' first"
    raise StudyError(f"{ref}: STUDY: no study file {db} in {Path.cwd()}; {hint}")


def read_storage(url: str) -> tuple[optuna.storages.BaseStorage, list[str]]:
    """The storage at ``url`` opened for reading (nothing is created: no file, table or folder) and the names of the
    studies in it.

    Raises:
        StudyError: No such SQLite or journal file, no driver, or a storage that cannot be read (:func:`_unreadable`).
    """
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise StudyError(f"{url}: STUDY: no such study file; give a study name, a .db path or a storage URL")
    journal = journal_file(url, "STUDY")
    if journal is not None and not Path(journal).is_file():
        raise StudyError(f"{url}: STUDY: no such journal file; give the journal:///PATH.log that 'sweep run' wrote")
    if journal is not None:
        check_journal(url, journal, "STUDY")
    try:
        storage: optuna.storages.BaseStorage
        if journal is not None:
            storage = HeartbeatJournalStorage(journal)
        else:
            storage = optuna.storages.RDBStorage(
                url,
                skip_table_creation=True,
                engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
            )
        return storage, optuna.get_all_study_names(storage)
    except ImportError as exc:
        raise StudyError(f"{redact_url(url)}: STUDY: no database driver for it is installed ({exc})") from None
    except Exception as exc:  # sqlalchemy: not a database, locked, unreachable server, ...
        raise StudyError(_unreadable(url, exc)) from None
