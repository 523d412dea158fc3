"""Opening a study's storage: creating or loading the Optuna study (its objectives from
:mod:`sweeper.study._objectives`, its sampler from :mod:`sweeper.study._sampling`, its folder's ownership from
:mod:`sweeper.study._identity`), loading the study a reading command names, and storing a trial's result as its user
attributes. SQLite by default; PostgreSQL or MySQL to share a study between machines.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler
learns to avoid their region. Timeouts, crashes and errors are FAIL. The loop that runs trials is
:mod:`sweeper.sweep._loop`.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from sweeper.errors import StudyError
from sweeper.space import SearchSpace, TrialConfig
from sweeper.stability import RECORDED_COMPONENTS
from sweeper.study._coordination import AskLock, heartbeat_kwargs, sqlite_database, sqlite_file, storage_file
from sweeper.study._identity import (
    OWNER_FILE,
    STUDIES_DIR,
    STUDY_ID_ATTR,
    _owner,
    _write_owner,
    check_study_dir,
    default_storage,
    study_identity,
)
from sweeper.study._journal import JOURNAL_SCHEME, HeartbeatJournalStorage, check_journal, journal_file
from sweeper.study._objectives import DEFAULT_OBJECTIVES, Objective, is_sweeper_study, resolve_objectives
from sweeper.study._sampling import make_sampler, to_distributions
from sweeper.study._urls import redact_url, scrub_secrets
from sweeper.trial import TrialResult

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


def _storage(url: str) -> optuna.storages.BaseStorage:
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
    return high


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


def open_study(
    space: SearchSpace,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    objectives: Sequence[str] | None = None,
) -> optuna.Study:
    """Create the study, or load it when it exists (``load_if_exists``).

    Args:
        space: The parsed ``space.yaml``.
        storage: The storage URL; None: the space's, else ``sqlite:///studies/<name>.db``.
        study_name: The study's name; None: the space's.
        n_trials: The study's size, for the sampler's random start; None: the space's ``n_trials``.
        objectives: Names of registered objectives (:mod:`sweeper.study._objectives`), in order, for a new study;
            None: the space's ``study.objectives``, else :data:`~sweeper.study._objectives.DEFAULT_OBJECTIVES`. An
            existing study keeps its own (asking for others is refused).

    Raises:
        StudyError: The storage cannot be created or written, an existing study of that name has other directions, or
            ``studies/<name>/`` holds the trials of a study of that name in another storage (:func:`check_study_dir`).
    """
    name = study_name or space.study.name
    url = storage or space.study.storage or default_storage(name)
    if objectives is None:
        objectives = space.study.objectives
    wanted = DEFAULT_OBJECTIVES if objectives is None else resolve_objectives(objectives, str(space.path))
    sampler = make_sampler(space.study, n_trials or space.study.n_trials)
    opened = _opened_for(name, url)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=opened,
            sampler=sampler,
            directions=[o.direction for o in wanted],
            load_if_exists=True,
        )
    except ValueError as exc:
        raise StudyError(
            f"{url}: study.name: a study '{name}' exists with other directions ({exc}); choose another --study name"
        ) from None
    if not study.metric_names and not study.trials:  # an old study without metric names keeps its instability
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.name for o in wanted])
    _check_same_objectives(study, wanted if objectives is not None else None, url)
    _check_same_search(study, space, url)
    identity = study_identity(study)
    if identity is None:
        identity = uuid.uuid4().hex
        study.set_user_attr(STUDY_ID_ATTR, identity)
    _write_owner(name, url, identity)  # checked before the study was created
    return study


def _opened_for(name: str, url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url``, opened (a storage that cannot be opened is the first thing to say), after checking
    that ``studies/<name>/`` does not hold another study's trials (:func:`check_study_dir`, before anything is
    created); a refused command leaves no new empty database or journal (or its locks) behind.

    Raises:
        StudyError: The storage cannot be opened, or the folder belongs to another study.
    """
    database = storage_file(url)
    fresh = database is not None and not Path(database).exists()
    opened = _storage(url)
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


def _check_same_objectives(study: optuna.Study, wanted: Sequence[Objective] | None, url: str) -> None:
    """Refuse a study that is not a sweeper study, or (``wanted``: the objectives asked for, None when none were)
    one that ranks by other objectives: a study's objectives cannot change.

    Raises:
        StudyError: One line naming the study, what it ranks by and the fix.
    """
    name = study.study_name
    if not is_sweeper_study(study):
        raise StudyError(
            f"{url}: study.name: study '{name}' is not a sweeper study (directions "
            f"{study.directions}); choose another --study name"
        )
    if wanted is not None and study.metric_names and list(study.metric_names) != [o.name for o in wanted]:
        raise StudyError(
            f"{url}: study.objectives: study '{name}' ranks by {', '.join(study.metric_names)}, not "
            f"{', '.join(o.name for o in wanted)}; a study's objectives cannot change: keep them, or start a new "
            "study (--study NAME)"
        )


def _check_same_search(study: optuna.Study, space: SearchSpace, url: str) -> None:
    """Refuse a space whose searched values differ from those the study's trials were sampled from: Optuna cannot
    change a parameter's distribution in a study (``check_distribution_compatibility``), and would fail inside
    ``ask`` after the trial was created, leaving a RUNNING trial with no parameters.

    Raises:
        StudyError: One line naming the key, the values the study was measured with, and the fix.
    """
    wanted = to_distributions(space)
    seen: dict[str, BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for key, dist in t.distributions.items():
            seen.setdefault(key, dist)
    problems = []
    for key, dist in seen.items():
        if key not in wanted:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(dist, wanted[key])
        except ValueError:
            problems.append(f"{key} ({_describe(dist)}; now {_describe(wanted[key])})")
    if problems:
        raise StudyError(
            f"{space.path}: search.{problems[0].split(' ')[0]}: study '{study.study_name}' in {redact_url(url)} was "
            f"measured with other values of {', '.join(problems)}; a study's searched values cannot change: keep "
            f"them, or start a new study (--study NAME)"
        )


def _describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return "choices " + ", ".join(map(str, dist.choices))
    low, high = getattr(dist, "low", None), getattr(dist, "high", None)
    return f"a range {low} to {high}"


def record_result(trial: optuna.Trial | Any, result: TrialResult, config: TrialConfig) -> None:
    """Store a result as the trial's user attributes (``docs/contract.md``): every field, the instability components
    flattened, and the trial's settings as ``config`` (the one place a config becomes a dict)."""
    data = result.to_dict()
    measured = data.pop("instability_components") or {}
    components = {name: measured.get(name) for name in RECORDED_COMPONENTS}
    for key, value in {**data, **components, "config": config.to_dict()}.items():
        trial.set_user_attr(key, value)


def _url_of(ref: str) -> tuple[str, str | None]:
    """The storage URL a command's STUDY names, and the study's name when it names one: a URL or a path as given
    (a ``.log`` path is a journal), a study name by ``studies/<name>.db`` or, without it, by the storage its folder's
    ``study.json`` names (a server, a journal, another file). A URL or path may name one study of several in its
    storage after a ``#``: ``journal:///shared/night.log#night-2`` (a URL's own ``#`` is written ``%23``).

    Raises:
        StudyError: A path that is not a file, or a name with neither a database nor a folder that says where it is.
    """
    base, hash_sign, named = ref.rpartition("#")
    if hash_sign and named and ("://" in base or base.endswith((".log", ".db")) or "/" in base):
        return _url_of(base)[0], named
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


def load_existing_study(ref: str) -> tuple[optuna.Study, str]:
    """The study a command names (:func:`_url_of`): a study name (``studies/<name>.db``, or the storage its folder
    names), a ``.db`` or journal ``.log`` path, or a storage URL; a path or URL must hold exactly one study or name
    one after a ``#`` (``journal:///night.log#night-2``).

    Returns:
        ``(study, storage_url)``.

    Raises:
        StudyError: No such study file or study, or the storage holds several studies (their names are listed).
    """
    url, name = _url_of(ref)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise StudyError(f"{url}: STUDY: no such study file; give a study name, a .db path or a storage URL")
    journal = journal_file(url)
    if journal is not None and not Path(journal).is_file():
        raise StudyError(f"{url}: STUDY: no such journal file; give the journal:///PATH.log that 'sweep run' wrote")
    if journal is not None:
        check_journal(url, journal, "STUDY")
    try:  # read what is there: create no file, table or folder
        storage: optuna.storages.BaseStorage
        if journal is not None:
            storage = HeartbeatJournalStorage(journal)
        else:
            storage = optuna.storages.RDBStorage(
                url,
                skip_table_creation=True,
                engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
            )
        names = optuna.get_all_study_names(storage)
    except ImportError as exc:
        raise StudyError(f"{redact_url(url)}: STUDY: no database driver for it is installed ({exc})") from None
    except Exception as exc:  # sqlalchemy: not a database, locked, unreachable server, ...
        raise StudyError(_unreadable(url, exc)) from None
    if name is None:
        if len(names) != 1:
            raise StudyError(
                f"{redact_url(url)}: STUDY: holds {len(names)} studies ({', '.join(names) or 'none'}); "
                f"give one after a '#' ('sweep report {redact_url(url)}#{names[0] if names else 'NAME'}'), or by name "
                f"alone in the folder its sweep ran in (its studies/NAME/{OWNER_FILE} says where the study is)"
            )
        name = names[0]
    elif name not in names:
        # a database file renamed or copied under another name still holds the study of its first name: its path
        # reads that one (issue 55)
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else journal
        by_path = f"; its path reads the one it holds: 'sweep report {path}'" if path and len(names) == 1 else ""
        raise StudyError(
            f"{redact_url(url)}: STUDY: no study '{name}' in it (it holds {', '.join(names) or 'none'}){by_path}"
        )
    study = optuna.load_study(study_name=name, storage=storage)
    if not is_sweeper_study(study):
        raise StudyError(
            f"{redact_url(url)}: STUDY: '{name}' is not a sweeper study (objectives "
            f"{study.metric_names or [d.name.lower() for d in study.directions]}); give a study that "
            "'sweep run' made"
        )
    return study, url  # reading commands never refuse for the folder's owner (a copy is read as it is)
