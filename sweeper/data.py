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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """

    index: int
    messages: tuple[Mapping[str, str], ...] | None = None
    text: str | None = None


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


def detect_format(columns: Sequence[str], path: str = "<dataset>") -> str:
    """The format of a table from its column names.

    ``messages`` -> ``chat``; ``instruction`` + ``output`` -> ``alpaca``; ``prompt`` + ``completion`` ->
    ``prompt_completion``; ``text`` -> ``text`` (checked in that order).

    Raises:
        DataError: None of these column sets is present.
    """
    cols = set(columns)
    if "messages" in cols:
        return "chat"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if "text" in cols:
        return "text"
    raise DataError(
        f"{path}: dataset.format: cannot detect the format from columns {sorted(cols)}; give rows with 'messages', "
        "'instruction'/'output', 'prompt'/'completion' or 'text', or set dataset.format"
    )


def _row_to_sample(row: Mapping[str, Any], index: int, fmt: str) -> Sample | None:
    """One row as a :class:`Sample`, or None when it has no usable content."""

    def s(key: str) -> str:
        value = row.get(key)
        return value if isinstance(value, str) else ("" if value is None else str(value))

    if fmt == "text":
        text = s("text")
        return Sample(index=index, text=text) if text.strip() else None
    if fmt == "prompt_completion":
        if not s("prompt").strip() and not s("completion").strip():
            return None
        return Sample(
            index=index,
            messages=({"role": "user", "content": s("prompt")}, {"role": "assistant", "content": s("completion")}),
        )
    if fmt == "alpaca":
        prompt = s("instruction") + (("\n\n" + s("input")) if s("input").strip() else "")
        if not prompt.strip() and not s("output").strip():
            return None
        return Sample(
            index=index, messages=({"role": "user", "content": prompt}, {"role": "assistant", "content": s("output")})
        )
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    turns = []
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            return None
        turns.append({"role": str(m["role"]).strip().lower(), "content": _content_text(m["content"])})
    if not any(t["role"] == "assistant" for t in turns):
        return None
    return Sample(index=index, messages=tuple(turns))


def _content_text(content: Any) -> str:
    """A message's content as text: a string as is, None as "", OpenAI-style parts (``[{"type": "text", "text":
    ...}]``) joined, anything else as its JSON text."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return json.dumps(content, ensure_ascii=False)


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
            raise DataError(
                f"{spec.path}: dataset.path: cannot read it as {builder} ({cause}); check the file"
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


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's first line (``datasets`` wraps the parser's error in a generic one)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_samples(spec: DatasetSpec) -> list[Sample]:
    """The study's samples: loaded, converted to one format, shuffled with ``spec.seed``, cut to ``max_samples``.

    Every trial calls this with the same spec and so sees the same samples in the same order.

    Raises:
        DataError: The dataset is missing, unreadable, of an undetectable format, or has no usable row.
    """
    if spec.path == BUILTIN_PYDOC:
        samples = _pydoc_samples()
    elif spec.path.startswith("builtin:"):
        raise DataError(f"{spec.path}: dataset.path: unknown built-in dataset; the built-in is {BUILTIN_PYDOC}")
    else:
        rows = _load_rows(spec)
        fmt = spec.format if spec.format != "auto" else detect_format(rows.column_names, spec.path)
        samples = [s for i, row in enumerate(rows) if (s := _row_to_sample(row, i, fmt)) is not None]
    if not samples:
        raise DataError(
            f"{spec.path}: dataset: no usable rows (all empty or malformed); check the file's "
            f"columns and dataset.format ({spec.format})"
        )
    order = list(range(len(samples)))
    random.Random(spec.seed).shuffle(order)
    return [samples[i] for i in order[: spec.max_samples]]


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


def _supervised_spans(messages: Sequence[Mapping[str, str]], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant replies (template tokens included).

    Each assistant turn's span is ``[len(render(turns before, add_generation_prompt)), len(render(turns through))``;
    a template that is not prefix-stable (it rewrites earlier turns) supervises only the last reply.
    """
    template = _chat_template(tokenizer)
    full = tokenizer.apply_chat_template(list(messages), tokenize=False, chat_template=template)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = (
            tokenizer.apply_chat_template(
                list(messages[:i]), tokenize=False, add_generation_prompt=True, chat_template=template
            )
            if i
            else ""
        )
        through = tokenizer.apply_chat_template(list(messages[: i + 1]), tokenize=False, chat_template=template)
        if through.startswith(before) and full.startswith(through):
            spans.append((len(before), len(through)))
    if not spans:
        before = tokenizer.apply_chat_template(
            list(messages[:-1]), tokenize=False, add_generation_prompt=True, chat_template=template
        )
        spans.append((min(len(before), len(full)), len(full)))
    return full, spans


def tokenize_samples(samples: Sequence[Sample], tokenizer: Any, max_seq_length: int) -> list[TokenizedSample]:
    """Tokenize with the tokenizer's chat template (or :data:`DEFAULT_CHAT_TEMPLATE`), loss on replies only.

    A token is supervised when its first character lies inside an assistant reply (offsets from the fast
    tokenizer); ``text`` samples are supervised throughout. Rows longer than ``max_seq_length`` are truncated from
    the right (the reply's tail is cut, as TRL's SFTTrainer does).

    Args:
        samples: From :func:`load_samples`.
        tokenizer: A ``transformers`` fast tokenizer (offset mapping needed).
        max_seq_length: Tokens per row after truncation, >= 1.

    Raises:
        DataError: The tokenizer cannot return offsets (not a fast tokenizer).
    """
    out = []
    for sample in samples:
        if sample.text is not None:
            enc = tokenizer(sample.text, add_special_tokens=True)
            ids = list(enc["input_ids"])
            labels = list(ids)
        else:
            text, spans = _supervised_spans(sample.messages or (), tokenizer)
            try:
                enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            except NotImplementedError:
                raise DataError(
                    "tokenizer: model.name_or_path: the tokenizer is not a fast tokenizer (no offsets); "
                    "use a checkpoint with tokenizer.json"
                ) from None
            ids = list(enc["input_ids"])
            labels = [
                tok if any(a <= start < b for a, b in spans) else -100
                for tok, (start, _end) in zip(ids, enc["offset_mapping"])
            ]
        out.append(
            TokenizedSample(
                index=sample.index, input_ids=ids[:max_seq_length], labels=labels[:max_seq_length], n_tokens=len(ids)
            )
        )
    return out
