"""The dataset formats (text, prompt/completion, alpaca, chat, ShareGPT): detecting a file's format from its columns
and turning one row into a :class:`~sweeper.data.Sample`, or a :class:`~sweeper.data.DroppedRow` with its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.data._samples import DroppedRow, Sample
from sweeper.errors import DataError

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
            index,
            f"{_a(other)} {other} row in {_a(fmt)} {fmt} dataset (one format per file: split the file, or set "
            "dataset.format)",
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
    """A message's content as text: a string as is, OpenAI-style text parts (``[{"type": "text", "text": ...}]``)
    joined. Anything else is not text a model of this tool can train on and drops the row, counted with its reason
    (docs/data.md): null (often a tool-call turn), a number (``"content": 12345``: a JSON number where the tools'
    chat templates expect a string; which text it stands for, ``12345`` or ``12345.0``, is the writer's guess, issue
    68), parts that are not text (an image), a mapping, a boolean."""
    if isinstance(content, str):
        return content
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        return _NotText(f"a turn whose content is a number ({content!r}), not text; write it as a string")
    if content is None:
        return _NotText("a turn whose content is null")
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    if isinstance(content, list):
        kinds = sorted({str(p.get("type", "?")) if isinstance(p, Mapping) else type(p).__name__ for p in content})
        return _NotText(f"a turn whose content is not text (parts: {', '.join(kinds) or 'none'})")
    return _NotText(f"a turn whose content is not text (a {type(content).__name__})")


def _a(word: str) -> str:
    """The indefinite article of ``word``: ``an alpaca row``, ``a chat row``."""
    return "an" if word[:1].lower() in "aeiou" else "a"
