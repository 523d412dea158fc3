"""Loading samples: the built-in corpus (pydoc's topics), local ``.jsonl``/``.json``/``.csv``/``.parquet`` files and
hub datasets (through ``datasets``, offline when the hub is unreachable), shuffled and cut to ``max_samples``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

from sweeper.data._formats import _majority_format, _row_to_sample
from sweeper.data._samples import DroppedRow, Sample, Samples, describe_dropped
from sweeper.errors import DataError
from sweeper.space import DatasetSpec

BUILTIN_PYDOC = "builtin:pydoc-topics"


#: Characters per chunk when a pydoc topic is split into several samples (about 400-600 tokens of English).
PYDOC_CHUNK_CHARS = 2000


_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _pydoc_samples() -> list[Sample]:
    """The standard library's ``pydoc_data.topics`` as chat samples: a question naming the topic, its text as reply.

    Long topics are split at paragraph boundaries into chunks of about ``PYDOC_CHUNK_CHARS`` characters, each its
    own sample (part k of n), which gives a few hundred samples of real English technical prose.
    """
    from pydoc_data.topics import topics

    out: list[Sample] = []
    for name in sorted(topics):
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", topics[name]) if p.strip()]
        chunks: list[str] = []
        for p in paragraphs:
            if chunks and len(chunks[-1]) + len(p) < PYDOC_CHUNK_CHARS:
                chunks[-1] += "\n\n" + p
            else:
                chunks.append(p)
        for k, chunk in enumerate(chunks, 1):
            part = f" (part {k} of {len(chunks)})" if len(chunks) > 1 else ""
            question = f"Explain the Python language topic '{name}'{part}."
            out.append(
                Sample(
                    index=len(out),
                    messages=({"role": "user", "content": question}, {"role": "assistant", "content": chunk}),
                )
            )
    return out


def _hub_unreachable(repo_id: str) -> bool:
    """One request to the hub for ``repo_id`` (10 s timeout): True when the network does not answer at all (no route,
    no DNS), so that the dataset is read from the local cache only instead of after minutes of retries."""
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(repo_id, timeout=10)
    except Exception as exc:
        names = {c.__name__ for c in type(exc).__mro__}
        return bool(
            names
            & {
                "ConnectError",
                "ConnectTimeout",
                "NetworkError",
                "TransportError",
                "ConnectionError",
                "Timeout",
                "TimeoutException",
            }
        )
    return False


@contextlib.contextmanager
def _offline(on: bool):
    """Within the block, ``datasets`` and ``huggingface_hub`` act as under ``HF_HUB_OFFLINE=1`` (their flags are read
    at import, so both module constants are set and restored)."""
    if not on:
        yield
        return
    import datasets
    import huggingface_hub

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _not_a_file(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (a FIFO, a device such as ``/dev/null``, a socket, a
    symbolic link that loops or points nowhere), or None when nothing is there."""
    import stat

    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python 3.11's "Symlink loop"
            return "a symbolic link that loops"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "a symbolic link that loops"
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        mode = path.stat().st_mode
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return what
    return None


def _load_rows(spec: DatasetSpec) -> Any:
    """The rows of a local file or hub dataset, through ``datasets``."""
    import datasets

    # Their own log lines (a parser's failure, retries of an unreachable hub) would add lines to our one-line errors.
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    logging.getLogger("huggingface_hub").setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    path = Path(spec.path).expanduser()
    if path.suffix or path.exists() or spec.path.startswith((".", "/", "~")):
        return _load_file(spec, path)
    return _load_hub(spec)


def _load_file(spec: DatasetSpec, path: Path) -> Any:
    """The rows of the local file ``path`` (``spec.path`` expanded); a :class:`DataError` naming what is wrong with
    it (a folder, missing, not a regular file, an unsupported type, empty, not UTF-8, unreadable)."""
    import datasets

    if path.is_dir():
        raise DataError(f"{spec.path}: dataset.path: is a directory; give a .jsonl, .json, .csv or .parquet file")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        what = _not_a_file(path)
        if what:  # it exists (or loops): saying "no such file" sent users looking for a file that is there
            raise DataError(
                f"{spec.path}: dataset.path: {what}, not a regular file; give a .jsonl, .json, .csv or .parquet "
                "file (a copy of a pipe's output, or the file a link points to)"
            )
        raise DataError(
            f"{spec.path}: dataset.path: no such file{where}; give an existing .jsonl, .json, .csv "
            "or .parquet file, a hub id, or builtin:pydoc-topics"
        )
    builder = _LOCAL_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(
            f"{spec.path}: dataset.path: unsupported file type '{path.suffix}'; use .jsonl, .json, .csv or .parquet"
        )
    size = path.stat().st_size
    if size == 0 or (builder != "parquet" and size < 2**20 and not path.read_bytes().strip()):
        raise DataError(f"{spec.path}: dataset.path: the file is empty; give a file with one sample per row")
    if builder != "parquet":
        # JSON text is UTF-8 (RFC 8259): the json reader keeps invalid bytes and the first read of that row
        # raised UnicodeDecodeError from pyarrow (a traceback); the csv reader refuses them as ArrowInvalid
        not_utf8 = _first_non_utf8_line(path)
        if not_utf8:
            raise DataError(
                f"{spec.path}: dataset.path: {not_utf8} is not UTF-8; save the file as UTF-8 (e.g. iconv -f "
                "latin1 -t utf-8), or fix that line"
            )
    try:
        # A local file needs nothing from the hub: offline, datasets sends no load-count request (a HEAD to the
        # hub per load; where no network answers, a name lookup that waited 5 s)
        with _offline(True):
            loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
        return _csv_empty_cells_as_text(loaded) if builder == "csv" else loaded
    except Exception as exc:  # datasets raises many types for unreadable files
        cause = _root_cause(exc)
        if "corresponds to no data" in cause:
            raise DataError(
                f"{spec.path}: dataset.path: the file has no data rows; give a file with one sample per row"
            ) from None
        bad_line = _first_bad_json_line(path) if path.suffix.lower() in (".jsonl", ".json") else None
        raise DataError(
            f"{spec.path}: dataset.path: cannot read it as {builder} ({bad_line or cause}); "
            + ("fix that line" if bad_line else "check the file")
        ) from None


def _load_hub(spec: DatasetSpec) -> Any:
    """The rows of the hub dataset ``spec.path`` (``spec.split``), offline where the hub cannot be reached; a
    :class:`DataError` where it is neither reachable nor cached."""
    import datasets

    offline = _hub_unreachable(spec.path)
    try:
        with _offline(offline):
            return datasets.load_dataset(spec.path, split=spec.split)
    except Exception as exc:
        if offline:
            raise DataError(
                f"{spec.path}: dataset.path: not a local file, the hub cannot be reached from here, and "
                "it is not in the local datasets cache; give a local .jsonl/.json/.csv/.parquet file, or "
                "load the dataset once where the hub can be reached"
            ) from None
        raise DataError(
            f"{spec.path}: dataset.path: not a local file and not loadable from the hub "
            f"({_root_cause(exc)}); give a local file, or a hub id already in the local datasets cache "
            "when offline"
        ) from None


def _csv_empty_cells_as_text(table: Any) -> Any:
    """A CSV's empty cells in its text columns as empty strings. CSV has no null: pandas (under ``datasets``) reads an
    empty cell as missing, which would drop the row as "'completion' is null", where the same empty reply in a JSONL
    file (``""``) trains and the audit flags it (``empty_reply``); one rule for both."""
    text = [
        name
        for name, feature in table.features.items()
        if getattr(feature, "dtype", None) in ("string", "large_string")
    ]
    if not text or not any(v is None for name in text for v in table[name]):
        return table
    return table.map(lambda row: {name: "" if row[name] is None else row[name] for name in text})


def _first_non_utf8_line(path: Path) -> str | None:
    """``line N (byte 0xff at column C)`` for the first line of a text file that is not UTF-8, or None; read line by
    line, so a large file is never held whole."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number} (byte 0x{line[exc.start]:02x} at column {exc.start + 1})"
    return None


def _first_bad_json_line(path: Path) -> str | None:
    """``line N: <why>`` for the first line of a JSON-lines file that is not a JSON object (a ``.json`` file that
    is one JSON document is read whole), or None when every line is one; files over 256 MiB are not scanned."""
    if path.stat().st_size > 256 * 2**20:
        return None
    text = path.read_text(errors="replace")
    try:
        json.loads(text)
        return None  # one JSON document: its own error stands
    except ValueError:
        pass
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"line {number}: {exc.msg} at column {exc.colno}"
        if not isinstance(value, dict):
            return f"line {number}: a JSON {type(value).__name__}, not an object with the sample's fields"
    return None


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's first line (``datasets`` wraps the parser's error in a generic one)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_samples(spec: DatasetSpec) -> Samples:
    """The study's samples: loaded, converted to one format, shuffled with ``spec.seed``, cut to ``max_samples``.

    Every trial calls this with the same spec and so sees the same samples in the same order. No row is left out
    silently: the result is a :class:`Samples`, whose ``dropped`` holds the rows that give no sample, each with its
    reason (:func:`unused_rows` adds the rows the chat template refuses, :func:`dataset_rows` counts the file's rows).

    Raises:
        DataError: The dataset is missing, unreadable, of an undetectable format, or has no usable row.
    """
    dropped: list[DroppedRow] = []
    if spec.path == BUILTIN_PYDOC:
        samples = _pydoc_samples()
        n_rows = len(samples)
    elif spec.path.startswith("builtin:"):
        raise DataError(f"{spec.path}: dataset.path: unknown built-in dataset; the built-in is {BUILTIN_PYDOC}")
    else:
        rows = _load_rows(spec)
        fmt = spec.format if spec.format != "auto" else _majority_format(rows, spec.path)
        samples = []
        n_rows = 0
        for i, row in enumerate(rows):
            n_rows += 1
            got = _row_to_sample(row, i, fmt)
            (samples if isinstance(got, Sample) else dropped).append(got)  # type: ignore[arg-type]
    if not samples:
        why = f": {describe_dropped(dropped)}" if dropped else ""
        raise DataError(
            f"{spec.path}: dataset: no usable rows{why}; check the file's columns and dataset.format ({spec.format})"
        )
    order = list(range(len(samples)))
    random.Random(spec.seed).shuffle(order)
    return Samples([samples[i] for i in order[: spec.max_samples]], dropped, n_rows)
