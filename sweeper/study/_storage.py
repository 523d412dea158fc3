"""The study: an Optuna study of the objectives of :mod:`sweeper.study._objectives` (by default two, minimized:
``peak_memory_gib`` and ``edge_proximity``) in an RDB storage (SQLite by default, PostgreSQL or MySQL to share it
between machines), and what sweeper stores and reads there.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler
learns to avoid their region. Timeouts, crashes and errors are FAIL. The loop that runs trials is
:mod:`sweeper.study._loop`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from sweeper.errors import StudyError
from sweeper.space import Categorical, SearchSpace, StudySpec, TrialConfig
from sweeper.stability import COMPONENTS, DIAGNOSTICS
from sweeper.study._coordination import AskLock, heartbeat_kwargs, in_memory, sqlite_database, sqlite_file
from sweeper.study._objectives import DEFAULT_OBJECTIVES, is_sweeper_study, resolve_objectives
from sweeper.trial import TrialResult, TrialStatus

#: Root of studies and their artifacts, relative to the working directory (``docs/contract.md``).
STUDIES_DIR = Path("studies")


def default_storage(name: str) -> str:
    """``sqlite:///studies/<name>.db`` (relative to the working directory)."""
    return f"sqlite:///{STUDIES_DIR / (name + '.db')}"


def trial_dir(study_name: str, number: int) -> Path:
    """``studies/<study>/trials/<number>/``: the trial's config, result, worker log and artifacts."""
    return study_dir(study_name) / "trials" / str(number)


def to_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the searched keys (fixed keys are not parameters)."""
    out: dict[str, BaseDistribution] = {}
    for key, dim in space.search.items():
        if isinstance(dim, Categorical):
            out[key] = CategoricalDistribution(list(dim.choices))
        elif dim.is_int:
            out[key] = IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
        else:
            out[key] = FloatDistribution(dim.low, dim.high, log=dim.log, step=dim.step)
    return out


#: Name of the constraint a NaN/OOM trial violates (optuna ``Trial.set_constraint``).
FAILURE_CONSTRAINT = "not_nan_or_oom"


def failure_constraint(status: str) -> float:
    """Constraint value of a trial: 1.0 (infeasible) when PRUNED as nan/oom/predicted_oom/dominated_oom, else -1.0.

    Optuna's TPE sorts infeasible trials behind every feasible one when it splits trials into good and bad
    (``optuna/samplers/_tpe/sampler.py``, ``_split_trials``), and NSGA-II ranks them last, so the sampler learns to
    avoid the region of a NaN or an OOM even though such a trial has no objective values.
    """
    try:
        return 1.0 if TrialStatus(status).pruned else -1.0
    except ValueError:  # not a status sweeper knows: not a result about the configuration
        return -1.0


def n_startup_trials(n_trials: int) -> int:
    """Random trials before TPE models the space: a quarter of the study, between 3 and 10 (optuna's default).

    A short study (the demo's 10 trials) should still spend most trials learning; a long one keeps optuna's 10.
    """
    return max(3, min(10, n_trials // 4))


def make_sampler(spec: StudySpec, n_trials: int, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler: TPE (multivariate, constant liar for parallel asks), random, or NSGA-II, seeded with
    ``seed`` (default ``spec.seed``).

    TPE learns from PRUNED trials (their :func:`failure_constraint`), which is why it is the default; NSGA-II selects
    parents from COMPLETE trials only, so NaN/OOM trials teach it nothing; random sampling learns nothing at all.
    """
    seed = spec.seed if seed is None else seed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if spec.sampler == "nsgaii":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            constant_liar=True,
            n_startup_trials=n_startup_trials(n_trials),
        )


#: The name under which sweeps take the storage-wide lock while one of them creates Optuna's tables.
SCHEMA_LOCK = "\0schema"


def _storage(url: str) -> optuna.storages.BaseStorage:
    heartbeat = heartbeat_kwargs()
    # A long busy timeout: several processes may write one SQLite file (one machine only).
    engine_kwargs = {"connect_args": {"timeout": 60}} if sqlite_database(url) is not None else None
    database = sqlite_file(url)
    if database is not None:
        db = Path(database)
        if db.is_dir():
            raise StudyError(
                f"{url}: study.storage: {db} is a folder; give the path of a .db file, e.g. sqlite:///{db}/study.db"
            )
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
                f"{url}: study.storage: cannot create {db.parent} ({exc.strerror}); choose a "
                "writable folder with --storage"
            ) from None
        if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise StudyError(
                f"{url}: study.storage: {db} is not writable; fix its permissions or choose another --storage"
            )
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
            "give sqlite:///PATH.db or a reachable postgresql:// or mysql:// URL"
        ) from None


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
    return (
        f"{where}: STUDY: cannot read it as an Optuna study database ({type(causes[-1]).__name__}: {first}); "
        "give the .db that 'sweep run' wrote"
    )


def _password(url: str) -> str | None:
    """The password in a URL's user info (:func:`_userinfo`), or None."""
    parts = _userinfo(url)
    return parts[1].split(":", 1)[1] if parts is not None and ":" in parts[1] else None


def scrub_secrets(text: str, url: str) -> str:
    """``text`` (a driver's error message about ``url``) with the URL's password, and any piece of it a parser may
    have split off at ``@``, ``:`` or ``/``, replaced by ``***``; then :func:`redact_url` on what is left."""
    secret = _password(url)
    if secret:
        pieces = sorted({secret, *re.split(r"[@:/]", secret)}, key=len, reverse=True)
        for piece in pieces:
            if len(piece) >= 3:
                text = text.replace(piece, "***")
    return redact_url(text)


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme, userinfo, after)`` of ``scheme://userinfo@after``, or None. The password may hold ``@``, ``:`` and
    ``/`` unencoded: the user info ends at the last ``@`` before the query."""
    scheme, sep, rest = url.partition("://")
    head = rest.split("?", 1)[0]
    if not sep or "@" not in head:
        return None
    at = head.rindex("@")
    return scheme, rest[:at], rest[at + 1 :]


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``: in the user info (``postgresql://user:***@host/db``, see
    :func:`_userinfo`) and in a ``password=`` query parameter."""
    parts = _userinfo(url)
    if parts is not None and ":" in parts[1]:
        scheme, userinfo, after = parts
        url = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{after}"
    return re.sub(r"(?i)(password=)[^&;#]*", r"\1***", url)


def study_dir(study_name: str) -> Path:
    """``studies/<study>/``: the study's trials, artifacts, report and exports. A name that is not a plain file name
    (a study made outside sweeper may be called ``../x``) is made one, so nothing is written outside ``studies/``."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", study_name):
        return STUDIES_DIR / study_name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name).strip("._")[:80] or "study"
    return STUDIES_DIR / f"{safe}-{hashlib.sha256(study_name.encode()).hexdigest()[:8]}"


#: The file in a study's folder that names the study whose trials, artifacts and exports it holds.
OWNER_FILE = "study.json"

#: Study user attribute: the study's identity, a random UUID written when it is created (or first opened by a
#: version that writes one). It travels with the database: a copy of ``studies/<name>.db`` is the same study
#: wherever it lies, so ownership of ``studies/<name>/`` goes by it, not by the database's path.
STUDY_ID_ATTR = "study_id"


def study_identity(study: optuna.Study) -> str | None:
    """The study's :data:`STUDY_ID_ATTR`, or None for a study written before identities (or not by sweeper)."""
    raw = study.user_attrs.get(STUDY_ID_ATTR)
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


def _owner(study_name: str) -> dict[str, Any] | None:
    """What ``studies/<study_name>/``'s :data:`OWNER_FILE` says, or None (no file, or not one sweeper wrote)."""
    try:
        owner = json.loads((study_dir(study_name) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


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


def _owner_conflict(study_name: str, url: str, study_id: str | None) -> str | None:
    """A line saying that ``studies/<study_name>/`` belongs to another study of that name, or None.

    It does when its :data:`OWNER_FILE` names another study (:func:`_same_study`) that may still exist: one in a
    SQLite file that is still there, or in any other database. An owner file naming a SQLite file that is gone
    (deleted) is not a conflict: that study's trials can no longer be read anyway, and the folder is taken over.
    """
    owner = None if in_memory(url) else _owner(study_name)
    if owner is None or _same_study(owner, url, study_id):
        return None
    other = owner.get("sqlite_file")
    theirs = owner.get("study_id")
    if isinstance(other, str) and not Path(other).is_file():
        return None
    them = f"'{study_name}'" + (f" (id {str(theirs)[:8]})" if theirs else "")
    me = f" (id {study_id[:8]})" if study_id else " (a new study)"
    return (
        f"{redact_url(url)}: --storage: {study_dir(study_name)}/ holds the trials, artifacts and exports of another "
        f"study {them} in {owner.get('storage', 'another storage')}, not of this one{me}; give this one another name "
        "(--study NAME), or run it from another folder, so that neither overwrites the other's files"
    )


def _write_owner(study_name: str, url: str, study_id: str | None) -> None:
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


def check_study_dir(study_name: str, url: str, study_id: str | None = None) -> None:
    """Refuse to write ``studies/<study_name>/`` (trials, artifacts, report, exports) for the study ``study_id`` in
    ``url`` (None: a study not created yet) when the folder belongs to another study of that name (its
    :data:`OWNER_FILE`); writes nothing. ``sweep run`` and ``sweep confirm`` call it; reading commands do not.

    Raises:
        StudyError: One line naming both studies, their storages and identities, and the fix.
    """
    conflict = _owner_conflict(study_name, url, study_id)
    if conflict:
        raise StudyError(conflict)


def check_study_owner(study: optuna.Study, url: str) -> None:
    """:func:`check_study_dir` for an opened study (``sweep confirm`` before it writes a confirmation's folder).

    Raises:
        StudyError: ``studies/<name>/`` belongs to another study of that name.
    """
    check_study_dir(study.study_name, url, study_identity(study))


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
            None: :data:`~sweeper.study._objectives.DEFAULT_OBJECTIVES`. An existing study keeps its own.

    Raises:
        StudyError: The storage cannot be created or written, an existing study of that name has other directions, or
            ``studies/<name>/`` holds the trials of a study of that name in another storage (:func:`check_study_dir`).
    """
    name = study_name or space.study.name
    url = storage or space.study.storage or default_storage(name)
    wanted = DEFAULT_OBJECTIVES if objectives is None else resolve_objectives(objectives, str(space.path))
    sampler = make_sampler(space.study, n_trials or space.study.n_trials)
    database = sqlite_file(url)
    fresh = database is not None and not Path(database).exists()
    opened = _storage(url)  # a storage that cannot be opened is the first thing to say
    existing = None
    if name in {s.study_name for s in optuna.get_all_study_summaries(opened, include_best_trial=False)}:
        existing = optuna.load_study(study_name=name, storage=opened)
    try:
        check_study_dir(name, url, study_identity(existing) if existing is not None else None)  # before creating
    except StudyError:
        if fresh and database is not None:  # the refused command leaves no empty database (or its lock) behind
            for leftover in (Path(database), Path(f"{database}.lock")):
                leftover.unlink(missing_ok=True)
        raise
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
    if not is_sweeper_study(study):
        raise StudyError(
            f"{url}: study.name: study '{name}' is not a sweeper study (directions "
            f"{study.directions}); choose another --study name"
        )
    if objectives is not None and study.metric_names and list(study.metric_names) != [o.name for o in wanted]:
        raise StudyError(
            f"{url}: study.objectives: study '{name}' ranks by {', '.join(study.metric_names)}, not "
            f"{', '.join(o.name for o in wanted)}; a study's objectives cannot change: keep them, or start a new "
            "study (--study NAME)"
        )
    _check_same_search(study, space, url)
    identity = study_identity(study)
    if identity is None:
        identity = uuid.uuid4().hex
        study.set_user_attr(STUDY_ID_ATTR, identity)
    _write_owner(name, url, identity)  # checked before the study was created
    return study


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
    components = {name: measured.get(name) for name in (*COMPONENTS, *DIAGNOSTICS)}
    for key, value in {**data, **components, "config": config.to_dict()}.items():
        trial.set_user_attr(key, value)


def load_existing_study(ref: str) -> tuple[optuna.Study, str]:
    """The study a command names: a study name (``studies/<name>.db``), a ``.db`` path, or a storage URL; a path or
    URL must hold exactly one study.

    Returns:
        ``(study, storage_url)``.

    Raises:
        StudyError: No such study file or study, or the storage holds several studies (their names are listed).
    """
    if "://" in ref:
        url, name = ref, None
    elif ref.endswith(".db") or "/" in ref:
        if not Path(ref).is_file():
            raise StudyError(
                f"{ref}: STUDY: no such study file; give a study name (studies/<name>.db), a .db path or a storage URL"
            )
        url, name = f"sqlite:///{ref}", None
    else:
        db = STUDIES_DIR / f"{ref}.db"
        if not db.is_file():
            owner = _owner(ref)
            elsewhere = owner.get("storage") if owner is not None else None
            known = sorted(p.stem for p in STUDIES_DIR.glob("*.db")) if STUDIES_DIR.is_dir() else []
            if isinstance(elsewhere, str) and elsewhere != default_storage(ref):
                hint = f"{study_dir(ref)}/{OWNER_FILE} says the study is in {elsewhere}: give that URL as STUDY"
            else:
                hint = f"studies here: {', '.join(known)}" if known else "run 'sweep run SPACE.yaml' first"
            raise StudyError(f"{ref}: STUDY: no study file {db} in {Path.cwd()}; {hint}")
        url, name = default_storage(ref), ref
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise StudyError(f"{url}: STUDY: no such study file; give a study name, a .db path or a storage URL")
    try:  # read what is there: create no file, table or folder
        storage = optuna.storages.RDBStorage(
            url,
            skip_table_creation=True,
            engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
        )
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except ImportError as exc:
        raise StudyError(f"{redact_url(url)}: STUDY: no database driver for it is installed ({exc})") from None
    except Exception as exc:  # sqlalchemy: not a database, locked, unreachable server, ...
        raise StudyError(_unreadable(url, exc)) from None
    if name is None:
        if len(names) != 1:
            raise StudyError(
                f"{redact_url(url)}: STUDY: holds {len(names)} studies ({', '.join(names) or 'none'}); "
                "give one by name, e.g. 'sweep report NAME' with studies/NAME.db"
            )
        name = names[0]
    elif name not in names:
        raise StudyError(f"{redact_url(url)}: STUDY: no study '{name}' in it (it holds {', '.join(names) or 'none'})")
    study = optuna.load_study(study_name=name, storage=storage)
    if not is_sweeper_study(study):
        raise StudyError(
            f"{redact_url(url)}: STUDY: '{name}' is not a sweeper study (objectives "
            f"{study.metric_names or [d.name.lower() for d in study.directions]}); give a study that "
            "'sweep run' made"
        )
    return study, url  # reading commands never refuse for the folder's owner (a copy is read as it is)
