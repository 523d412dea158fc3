"""Training samples: the built-in corpus, local files and hub datasets, in four formats, tokenized for causal-LM
fine-tuning with the loss on the reply only.

Loading (:func:`load_samples`) imports ``datasets`` only for files and hub ids; tokenization
(:func:`tokenize_samples`) needs a ``transformers`` fast tokenizer. Neither imports torch itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.checkpoint import checkpoint_file, read_weight_map
from sweeper.errors import DataError
from sweeper.space import DatasetSpec

BUILTIN_PYDOC = "builtin:pydoc-topics"

#: Used when a tokenizer ships no chat template (the tiny test tokenizers, base models): ChatML without a system turn.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Characters per chunk when a pydoc topic is split into several samples (about 400-600 tokens of English).
PYDOC_CHUNK_CHARS = 2000

_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One training sample.

    Attributes:
        index: Row index in the source dataset (before shuffling), so a sample can be named in reports.
        messages: Chat turns ``[{"role": ..., "content": ...}]`` for chat-like formats, else None.
        text: Raw text for the ``text`` format (all tokens supervised), else None.
        completion: The row is a completion (``prompt_completion``, ``alpaca``): its reply is followed by the
            end-of-sequence token, as TRL's ``SFTTrainer`` appends it, unless the chat template's end of turn already
            is that token.
    """

    index: int
    messages: tuple[Mapping[str, str], ...] | None = None
    text: str | None = None
    completion: bool = False


@dataclass(frozen=True)
class DroppedRow:
    """A dataset row that is not trained on, and why.

    Attributes:
        index: The row's 0-based index in the dataset file.
        reason: Short and the same for rows with the same fault (rows are grouped by it): ``empty text``,
            ``no assistant turn``, ``unknown role 'function_call'``, ``a turn whose content is null``, ``a text row in
            a prompt_completion dataset (...)``, ``the chat template refuses it (...)``.
    """

    index: int
    reason: str


class Samples(list[Sample]):  # a list, so that every caller of load_samples keeps working
    """What :func:`load_samples` returns: the samples in trial order, plus the rows of the file not used.

    Attributes:
        dropped: Every row of the dataset that gave no sample, with its reason, by index (before the shuffle and
            ``max_samples``, which leave the other rows out on purpose).
        rows: Rows in the dataset (``len(dropped)`` of them unusable).
    """

    dropped: list[DroppedRow]
    rows: int

    def __init__(self, samples: Sequence[Sample] = (), dropped: Sequence[DroppedRow] = (), rows: int = 0):
        super().__init__(samples)
        self.dropped = list(dropped)
        self.rows = rows


@dataclass(frozen=True, kw_only=True)
class TokenizedSample:
    """A sample as token ids, not yet padded.

    Attributes:
        index: The sample's row index in the source dataset.
        input_ids: Token ids, ``len <= max_seq_length``.
        labels: Same length; ``-100`` on tokens without loss (prompt, system turn).
        n_tokens: Tokens before truncation (to tell how much ``max_seq_length`` cut).
    """

    index: int
    input_ids: list[int]
    labels: list[int]
    n_tokens: int


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


#: ShareGPT's speaker names (``from``) as chat roles, as axolotl's ``chat_template`` strategy and LLaMA-Factory's
#: ``sharegpt`` converter read them (``human``/``gpt``; ``observation`` is a tool's output); the chat roles
#: themselves map to themselves.
ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "tool": "tool",
    "observation": "tool",
}


def detect_format(columns: Sequence[str], path: str = "<dataset>") -> str:
    """The format of a table from its column names.

    ``conversations`` -> ``sharegpt``; ``messages`` -> ``chat``; ``instruction`` + ``output`` -> ``alpaca``;
    ``prompt`` + ``completion`` -> ``prompt_completion``; ``text`` -> ``text`` (checked in that order). ``chat`` and
    ``sharegpt`` are read alike: each turn as ``role``/``content`` or ``from``/``value``, with ShareGPT's speaker
    names (:data:`ROLE_ALIASES`), from ``messages`` or ``conversations``.

    Raises:
        DataError: None of these column sets is present.
    """
    cols = set(columns)
    if "conversations" in cols:
        return "sharegpt"
    if "messages" in cols:
        return "chat"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if "text" in cols:
        return "text"
    raise DataError(
        f"{path}: dataset.format: cannot detect the format from columns {sorted(cols)}; give rows with 'messages' or "
        "'conversations' (chat or ShareGPT turns), 'instruction'/'output', 'prompt'/'completion' or 'text'"
    )


#: The columns a row of each format holds (one of them at least); a row holding none of its format's columns but
#: another format's is a row of that format in a mixed file.
FORMAT_COLUMNS = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
    "chat": ("messages", "conversations"),
    "sharegpt": ("messages", "conversations"),
}


def _other_format(row: Mapping[str, Any], fmt: str) -> str | None:
    """The format of a row that holds none of ``fmt``'s columns (:data:`FORMAT_COLUMNS`) but another format's: a
    file mixing formats gives its columns to every row, with null where a row has no value."""
    if any(row.get(k) is not None for k in FORMAT_COLUMNS.get(fmt, ())):
        return None
    own = _row_format(row)
    return None if own is None or FORMAT_COLUMNS.get(own) == FORMAT_COLUMNS.get(fmt) else own


def _row_format(row: Mapping[str, Any]) -> str | None:
    """A row's own format, from its non-null columns (:func:`detect_format`), or None when they tell none."""
    try:
        return detect_format([k for k, v in row.items() if v is not None])
    except DataError:
        return None


def _majority_format(rows: Any, path: str) -> str:
    """``format: auto``: the format most rows have, each row's own from its non-null columns (:func:`detect_format`),
    ties broken in :func:`detect_format`'s order; the rows of another format are then dropped and counted. A table
    gives every row every column of the file, so the columns alone would let one stray ``messages`` row make a file of
    text rows a chat file.

    Raises:
        DataError: No row's format can be told from its columns.
    """
    counts = Counter(f for f in map(_row_format, rows) if f is not None)
    if not counts:
        return detect_format(rows.column_names, path)
    order = ["sharegpt", "chat", "alpaca", "prompt_completion", "text"]
    family = Counter({f: sum(n for g, n in counts.items() if FORMAT_COLUMNS[g] == FORMAT_COLUMNS[f]) for f in counts})
    return max(counts, key=lambda f: (family[f], counts[f], -order.index(f)))  # chat and sharegpt read alike


def _row_to_sample(row: Mapping[str, Any], index: int, fmt: str) -> Sample | DroppedRow:
    """One row as a :class:`Sample`, or a :class:`DroppedRow` saying why it has no usable content."""
    other = _other_format(row, fmt)
    if other is not None:
        return DroppedRow(
            index, f"a {other} row in a {fmt} dataset (one format per file: split the file, or set dataset.format)"
        )

    def field(key: str) -> str | _NotText | None:
        value = row.get(key)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return _NotText(f"'{key}' is not text (a {type(value).__name__})")

    def read(*keys: str, optional: tuple[str, ...] = ()) -> tuple[str, ...] | DroppedRow:
        """The fields as text; a field that is not text, or null where another field has content, drops the row."""
        values = {k: field(k) for k in (*keys, *optional)}
        for value in values.values():
            if isinstance(value, _NotText):
                return DroppedRow(index, value.reason)
        if not any(str(values[k] or "").strip() for k in keys):
            return DroppedRow(index, f"empty {' and '.join(keys)}")
        for key in keys:
            if values[key] is None:
                return DroppedRow(index, f"'{key}' is null")
        return tuple(str(values[k] or "") for k in (*keys, *optional))

    if fmt == "text":
        got = read("text")
        return got if isinstance(got, DroppedRow) else Sample(index=index, text=got[0])
    if fmt == "prompt_completion":
        if isinstance(row.get("prompt"), list) or isinstance(row.get("completion"), list):
            return _conversational_prompt_completion(row, index)
        got = read("prompt", "completion")
        if isinstance(got, DroppedRow):
            return got
        prompt, completion = got
        return Sample(
            index=index,
            messages=({"role": "user", "content": prompt}, {"role": "assistant", "content": completion}),
            completion=True,
        )
    if fmt == "alpaca":
        got = read("instruction", "output", optional=("input",))
        if isinstance(got, DroppedRow):
            return got
        instruction, output, extra = got
        prompt = instruction + (("\n\n" + extra) if extra.strip() else "")
        return Sample(
            index=index,
            messages=({"role": "user", "content": prompt}, {"role": "assistant", "content": output}),
            completion=True,
        )
    return _conversation(row, index)


def _conversational_prompt_completion(row: Mapping[str, Any], index: int) -> Sample | DroppedRow:
    """TRL's conversational prompt/completion row (``prompt`` and ``completion`` lists of turns) as one conversation.
    TRL trains the completion only, so a prompt holding an assistant turn (which the trial would train) or a
    completion holding another speaker's turn (which the trial would not) drops the row."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if not isinstance(prompt, list) or not isinstance(completion, list):
        return DroppedRow(index, "'prompt' and 'completion' are not both lists of turns (or both text)")

    def roles(turns: list) -> list[str]:
        return [
            ROLE_ALIASES.get(str(m.get("role") if m.get("role") is not None else m.get("from")).strip().lower(), "?")
            for m in turns
            if isinstance(m, Mapping)
        ]

    if "assistant" in roles(prompt):
        return DroppedRow(index, "a conversational prompt holding an assistant turn (TRL trains only the completion)")
    if not completion or set(roles(completion)) != {"assistant"}:
        return DroppedRow(index, "a conversational completion of other turns than the assistant's")
    got = _conversation({"messages": [*prompt, *completion], "system": row.get("system")}, index)
    return got


def _conversation(row: Mapping[str, Any], index: int) -> Sample | DroppedRow:
    """A ``chat`` or ``sharegpt`` row: turns from ``messages`` or ``conversations``, each ``role``/``content`` or
    ``from``/``value``; a top-level ``system`` string (LLaMA-Factory's ShareGPT column) opens the conversation when it
    has no system turn."""
    key = next((k for k in ("messages", "conversations") if row.get(k) is not None), None)
    turns_in = row.get(key) if key else None
    if isinstance(turns_in, str):  # a CSV cell or a column saved as JSON text
        try:
            turns_in = json.loads(turns_in)
        except ValueError:
            return DroppedRow(index, f"'{key}' is text, not a list of turns")
    if not isinstance(turns_in, list):
        return DroppedRow(index, "no list of turns in 'messages' or 'conversations'")
    if not turns_in:
        return DroppedRow(index, "empty conversation")
    turns = []
    for m in turns_in:
        if not isinstance(m, Mapping):
            return DroppedRow(index, "a turn that is not a mapping")
        # A file (or a datasets table) may give every turn both spellings, with null where a turn has none.
        role = m.get("role") if m.get("role") is not None else m.get("from")
        if role is None or ("content" not in m and "value" not in m):
            return DroppedRow(index, "a turn without role/content (or from/value)")
        name = str(role).strip().lower()
        if name not in ROLE_ALIASES:
            return DroppedRow(index, f"unknown role '{role}'")
        if m.get("tool_calls") or m.get("function_call"):
            return DroppedRow(index, "a turn with tool_calls (only text turns are read; it would train as empty)")
        content = _content_text(m.get("content") if m.get("content") is not None else m.get("value"))
        if isinstance(content, _NotText):
            return DroppedRow(index, content.reason)
        turns.append({"role": ROLE_ALIASES[name], "content": content})
    system = row.get("system")
    if isinstance(system, str) and system.strip() and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": system})
    if not any(t["role"] == "assistant" for t in turns):
        return DroppedRow(index, "no assistant turn")
    return Sample(index=index, messages=tuple(turns))


@dataclass(frozen=True)
class _NotText:
    """A turn's content that is not text, and why (the row is dropped with that reason)."""

    reason: str


def _content_text(content: Any) -> str | _NotText:
    """A message's content as text: a string as is, a number as its digits, OpenAI-style text parts (``[{"type":
    "text", "text": ...}]``) joined. Anything else is not text a model of this tool can train on and drops the row:
    null (often a tool-call turn), parts that are not text (an image), a mapping, a boolean."""
    if isinstance(content, str):
        return content
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        return str(content)
    if content is None:
        return _NotText("a turn whose content is null")
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    if isinstance(content, list):
        kinds = sorted({str(p.get("type", "?")) if isinstance(p, Mapping) else type(p).__name__ for p in content})
        return _NotText(f"a turn whose content is not text (parts: {', '.join(kinds) or 'none'})")
    return _NotText(f"a turn whose content is not text (a {type(content).__name__})")


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


def _load_rows(spec: DatasetSpec) -> Any:
    """The rows of a local file or hub dataset, through ``datasets``."""
    import datasets

    # Their own log lines (a parser's failure, retries of an unreachable hub) would add lines to our one-line errors.
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    logging.getLogger("huggingface_hub").setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    path = Path(spec.path).expanduser()
    if path.suffix or path.exists() or spec.path.startswith((".", "/", "~")):
        if path.is_dir():
            raise DataError(f"{spec.path}: dataset.path: is a directory; give a .jsonl, .json, .csv or .parquet file")
        if not path.is_file():
            where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
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
        try:
            return datasets.load_dataset(builder, data_files=str(path), split="train")
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


def load_samples(spec: DatasetSpec) -> list[Sample]:
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


def describe_dropped(dropped: Sequence[DroppedRow], limit: int = 5) -> str:
    """The rows not used, grouped by reason, most frequent first: ``30 rows: no assistant turn (rows 1, 3, 5, 7, 9
    and 25 more); 2 rows: unknown role 'function_call' (rows 4, 8)``."""
    groups: dict[str, list[int]] = {}
    for d in dropped:
        groups.setdefault(d.reason, []).append(d.index)
    parts = []
    for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        indices = sorted(indices)
        shown = ", ".join(str(i) for i in indices[:limit])
        more = f" and {len(indices) - limit} more" if len(indices) > limit else ""
        noun = "row" if len(indices) == 1 else "rows"
        parts.append(f"{len(indices)} {noun}: {reason} ({noun} {shown}{more})")
    return "; ".join(parts)


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer the trials use: the model's own, with its end-of-sequence token as padding when it has none.

    Shared by the worker and the data audit, so that ``sweep doctor`` sees exactly the tokens a trial trains on.

    Raises:
        ModelError: The tokenizer cannot be loaded (one line naming the folder).
    """
    from transformers import AutoTokenizer

    from sweeper.errors import ModelError

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # missing files, broken JSON, a tokenizer class that needs an uninstalled package, ...
        raise ModelError(
            f"{model_path}: model.name_or_path: cannot load its tokenizer ({_root_cause(exc)}); the "
            "folder needs a fast tokenizer (tokenizer.json) and a readable config.json"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _chat_template(tokenizer: Any) -> str:
    return tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE


#: ``{% generation %}`` (or ``{%- generation -%}``): the template marks the assistant's tokens itself, and
#: ``apply_chat_template(..., return_assistant_tokens_mask=True)`` returns them (TRL's ``assistant_only_loss``).
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
#: Stands for an assistant reply while its position in the rendered conversation is found; templates copy it
#: through (no whitespace to trim, no markup to escape).
_SENTINEL = "\ue000sweeper-reply\ue000"


class TemplateRefusal(Exception):
    """The chat template cannot render a row (its ``raise_exception``, e.g. roles that do not alternate), or does not
    show where a reply is."""


def _render(tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str) -> str:
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, chat_template=template)
    except Exception as exc:  # jinja2's TemplateError, or a template indexing a missing turn
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]
        raise TemplateRefusal(f"the chat template refuses it ({first})") from None


def _supervised_spans(messages: Sequence[Mapping[str, str]], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant replies: each reply's content and the
    template's end of its turn (``Hi.<|im_end|>\\n``), never the template's own text before it (a default system
    prompt the template injects, the assistant header).

    A reply starts where the template puts it when the conversation is cut after that turn and the reply replaced by
    a marker (the text before the marker is a prefix of the whole conversation); it ends where the conversation
    rendered through that turn ends. A template that rewrites earlier turns (not prefix-stable) is read by finding
    each reply's text in order instead.

    Raises:
        TemplateRefusal: The template raises on the row, or no reply can be located in what it renders.
    """
    template = _chat_template(tokenizer)
    full = _render(tokenizer, messages, template)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        probe = _render(tokenizer, [*messages[:i], {"role": "assistant", "content": _SENTINEL}], template)
        k = probe.find(_SENTINEL)
        through = _render(tokenizer, messages[: i + 1], template)
        if k >= cursor and full.startswith(probe[:k]) and full.startswith(through) and len(through) >= k:
            start, end = k, len(through)
        else:  # not prefix-stable: the reply's own text, then the end of turn the template writes after it
            content = m["content"].strip()
            found = full.find(content, cursor) if content else -1
            if found < 0:
                continue
            start, end = found, found + len(content)
            tail = probe[k + len(_SENTINEL) :] if k >= 0 else ""
            if tail and full.startswith(tail, end):
                end += len(tail)
        spans.append((start, end))
        cursor = end
    if not spans:
        raise TemplateRefusal("the chat template does not show where the reply is")
    return full, spans


def _generation_mask(messages: Sequence[Mapping[str, str]], tokenizer: Any, ids: Sequence[int]) -> list[int] | None:
    """transformers' assistant-token mask (1 on the tokens between ``{% generation %}`` and ``{% endgeneration %}``)
    when the template carries those markers and tokenizes to the same ids, else None."""
    template = _chat_template(tokenizer)
    if not _GENERATION_TAG.search(template):
        return None
    try:
        out = tokenizer.apply_chat_template(
            list(messages),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=template,
        )
    except Exception:
        return None
    if list(out["input_ids"]) != list(ids):
        return None
    return list(out["assistant_masks"])


def assistant_masks(sample: Sample, tokenizer: Any) -> tuple[list[int], list[int], list[int] | None]:
    """A chat sample's token ids, sweeper's loss mask over them, and transformers' mask for templates with
    ``{% generation %}`` markers (None otherwise): to check one against the other.

    sweeper's mask is 1 on every token that overlaps a span of :func:`_supervised_spans` (as transformers marks the
    tokens from the one holding a span's first character to the one holding its last).

    Raises:
        TemplateRefusal: See :func:`_supervised_spans`.
    """
    text, spans = _supervised_spans(sample.messages or (), tokenizer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    ours = [int(any(a < e and s < b for a, b in spans)) for s, e in enc["offset_mapping"]]
    return ids, ours, _generation_mask(sample.messages or (), tokenizer, ids)


def mask_disagreements(samples: Sequence[Sample], tokenizer: Any) -> list[int]:
    """Row indices of the chat samples on which the template's ``{% generation %}`` markers supervise other tokens
    than sweeper's own reply spans (:func:`assistant_masks`). The trials train what the markers say, as TRL's
    ``assistant_only_loss`` does; a difference is reported (``sweep doctor``'s ``generation_mask`` finding), never
    settled silently. ``[]`` for a template without markers.
    """
    if not _GENERATION_TAG.search(_chat_template(tokenizer)):
        return []
    out = []
    for sample in samples:
        if sample.messages is None:
            continue
        try:
            _, ours, theirs = assistant_masks(sample, tokenizer)
        except TemplateRefusal:
            continue  # counted as a dropped row
        if theirs is not None and theirs != ours:
            out.append(sample.index)
    return sorted(out)


def _encode(sample: Sample, tokenizer: Any) -> tuple[list[int], list[int]]:
    """One sample's ``(input_ids, labels)`` at full length.

    ``text`` rows and completions end with the end-of-sequence token, as TRL's ``SFTTrainer`` writes them
    (trl#1623): appended to the text, or after the reply when the chat template's end of turn is not that token.
    Templates with ``{% generation %}`` markers supervise what they mark (transformers' assistant-token mask; where
    that differs from sweeper's own spans, :func:`mask_disagreements` reports the row).
    """
    eos = tokenizer.eos_token
    if sample.text is not None:
        text = sample.text if not eos or sample.text.endswith(eos) else sample.text + eos
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        return ids, list(ids)
    text, spans = _supervised_spans(sample.messages or (), tokenizer)
    if sample.completion and eos:
        a, b = spans[-1]
        if eos not in text[a:b]:
            text = text[:b] + eos + text[b:]
            spans[-1] = (a, b + len(eos))
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        raise DataError(
            "tokenizer: model.name_or_path: the tokenizer is not a fast tokenizer (no offsets); "
            "use a checkpoint with tokenizer.json"
        ) from None
    ids = list(enc["input_ids"])
    marked = _generation_mask(sample.messages or (), tokenizer, ids)
    if marked is None:
        marked = [int(any(a < e and s < b for a, b in spans)) for s, e in enc["offset_mapping"]]
    return ids, [tok if m else -100 for tok, m in zip(ids, marked)]


def tokenize_samples(
    samples: Sequence[Sample], tokenizer: Any, max_seq_length: int, dropped: list[DroppedRow] | None = None
) -> list[TokenizedSample]:
    """Tokenize with the tokenizer's chat template (or :data:`DEFAULT_CHAT_TEMPLATE`), loss on replies only.

    A token is supervised when it overlaps an assistant reply or the end of its turn (offsets from the fast
    tokenizer; the template's own text, such as a default system prompt or the assistant header, is not); ``text``
    samples are supervised throughout. ``text`` rows and completions end with the end-of-sequence token (see
    :func:`_encode`). Rows longer than ``max_seq_length`` are truncated from the right (the reply's tail is cut, as
    TRL's SFTTrainer does).

    Args:
        samples: From :func:`load_samples`.
        tokenizer: A ``transformers`` fast tokenizer (offset mapping needed).
        max_seq_length: Tokens per row after truncation, >= 1.
        dropped: The rows the chat template refuses are left out of the result (a trial trains without them);
            when given, they are appended to it with the reason, to be reported (:func:`unused_rows`).

    Raises:
        DataError: The tokenizer cannot return offsets (not a fast tokenizer).
    """
    out = []
    for sample in samples:
        try:
            ids, labels = _encode(sample, tokenizer)
        except TemplateRefusal as exc:
            if dropped is not None:
                dropped.append(DroppedRow(sample.index, str(exc)))
            continue
        out.append(
            TokenizedSample(
                index=sample.index, input_ids=ids[:max_seq_length], labels=labels[:max_seq_length], n_tokens=len(ids)
            )
        )
    return out


def dataset_rows(samples: Sequence[Sample]) -> int:
    """Rows in the dataset file that :func:`load_samples` read (those it dropped included); ``len(samples)`` for a
    plain list."""
    return int(getattr(samples, "rows", len(samples)))


def unused_rows(samples: Sequence[Sample], tokenizer: Any) -> list[DroppedRow]:
    """Every dataset row a trial will not train on, with its reason: those :func:`load_samples` could not read
    (``samples.dropped`` when ``samples`` is its result) and those the chat template refuses, by index."""
    dropped = list(getattr(samples, "dropped", []))
    refused: list[DroppedRow] = []
    for sample in samples:
        if sample.messages is not None:
            try:
                _supervised_spans(sample.messages, tokenizer)
            except TemplateRefusal as exc:
                refused.append(DroppedRow(sample.index, str(exc)))
    return sorted(dropped + refused, key=lambda d: d.index)


#: Names of the input-embedding tensor in a checkpoint, by architecture family (Llama/Mistral/Qwen/Gemma; GPT-2;
#: BLOOM; InternLM; GPT-NeoX).
_EMBEDDING_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
    "embed_in.weight",
)


@dataclass(frozen=True, kw_only=True)
class SpecialTokenRow:
    """The checkpoint's input-embedding row of a special token the trials use.

    Attributes:
        roles: ``pad``, ``eos``, ``bos`` (one token may have several, e.g. the end-of-sequence token as padding).
        token: Its text.
        id: Its id.
        max_abs: The row's largest absolute value (NaN when the row holds NaN, inf when it holds inf).
    """

    roles: tuple[str, ...]
    token: str
    id: int
    max_abs: float


def special_token_rows(model_path: str, tokenizer: Any) -> list[SpecialTokenRow] | None:
    """The input-embedding rows of the special tokens the trials use (``pad``, ``eos``, ``bos`` of the tokenizer that
    :func:`load_tokenizer` gives), read from the checkpoint's safetensors files without loading the model.

    Returns:
        One entry per token id, or None when the checkpoint has no safetensors weights with a known embedding name.
    """
    import math

    index = checkpoint_file(model_path, "model.safetensors.index.json")
    if index is not None:
        try:
            weight_map = read_weight_map(index)
        except (OSError, ValueError, KeyError):
            return None
    else:
        single = checkpoint_file(model_path, "model.safetensors")
        if single is None:
            return None
        weight_map = None
    roles: dict[int, list[str]] = {}
    for role in ("pad", "eos", "bos"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(token_id, int) and token_id >= 0:
            roles.setdefault(token_id, []).append(role)
    if not roles:
        return []
    try:
        from safetensors import safe_open

        if weight_map is not None:
            name = next((k for s in _EMBEDDING_SUFFIXES for k in weight_map if k.endswith(s)), None)
            if name is None:
                return None
            file = checkpoint_file(model_path, weight_map[name])
        else:
            file, name = single, None
        if file is None:
            return None
        out = []
        with safe_open(str(file), framework="pt") as f:
            if name is None:
                name = next((k for s in _EMBEDDING_SUFFIXES for k in f.keys() if k.endswith(s)), None)  # noqa: SIM118
                if name is None:
                    return None
            table = f.get_slice(name)
            rows = table.get_shape()[0]
            for token_id, names in sorted(roles.items()):
                if token_id >= rows:
                    continue  # an id without a row: the audit's invalid_token_id
                row = table[token_id : token_id + 1].float()
                if bool(row.isnan().any()):
                    peak = math.nan
                elif bool(row.isinf().any()):
                    peak = math.inf
                else:
                    peak = float(row.abs().max())
                text = tokenizer.convert_ids_to_tokens(token_id)
                out.append(SpecialTokenRow(roles=tuple(names), token=str(text), id=token_id, max_abs=peak))
    except Exception:  # an unreadable or unusual checkpoint: the check is skipped, the trials will say more
        return None
    return out
