"""The machine a sweep runs on: the disk and folder checks made before each trial, and what each worker slot (a
``--workers`` slot: a thread of the sweep that runs one trial process at a time) gets: its GPU and its share of the
CPU cores.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sweeper.errors import RunError, StudyError

#: Free space (MiB) the studies folder's disk must have before a trial starts: a trial writes its log, result,
#: trace and artifacts (tens of KiB on the demo, up to a few MiB with a long nan_batch.jsonl) and SQLite grows.
MIN_FREE_MIB = 64


def check_disk(folder: Path, min_free_mib: float = MIN_FREE_MIB, storage: str | None = None) -> None:
    """Raise before a trial starts when ``folder``'s disk (or its nearest existing parent's) is nearly full; with
    ``storage`` (the study's URL), also when the disk of its file is (an SQLite database or a journal elsewhere, e.g.
    on a cluster's shared filesystem).

    Raises:
        RunError: Less than ``min_free_mib`` MiB free.
    """
    from sweeper.storage._coordination import storage_file

    file = storage_file(storage) if storage is not None else None
    if file is not None:
        check_disk(Path(file).absolute().parent, min_free_mib)
    probe = Path(folder).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_mib = shutil.disk_usage(probe).free / 2**20
    if free_mib < min_free_mib:
        raise RunError(
            f"{folder}: only {free_mib:.0f} MiB free on its disk (a trial needs {min_free_mib} MiB for its "
            "files); free some space and run the same command: finished trials are kept"
        )


def check_writable(folder: Path) -> None:
    """Create ``folder`` (the study's folder under ``studies/``) and check it can be written, before any trial.

    Raises:
        StudyError: It cannot be created or written (permissions, a read-only mount).
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(
            f"{folder}: cannot create the study's folder ({exc.strerror}); run from a folder you can "
            "write, or fix its permissions"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StudyError(
            f"{folder}: the study's folder is not writable (trial logs, results and artifacts go "
            "there); fix its permissions or run from another folder"
        )
