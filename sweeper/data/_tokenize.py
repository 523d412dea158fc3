"""Tokenizing samples as the trials train them: the chat template rendered, the loss on the reply spans only
(transformers' generation markers compared where a template has them), truncated to ``max_seq_length``.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from sweeper.data._load import _root_cause
from sweeper.data._samples import DroppedRow, Sample, TokenizedSample
from sweeper.errors import DataError

#: Used when a tokenizer ships no chat template (the tiny test tokenizers, base models): ChatML without a system turn.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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
    if _reply_lacks_eos(sample, text, spans, eos):
        a, b = spans[-1]
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


def eos_appended(sample: Sample, tokenizer: Any) -> bool:
    """Whether :func:`tokenize_samples` appends the end-of-sequence token to ``sample``'s reply: a completion
    (prompt/completion, alpaca) whose chat template ends the turn with another token (see :func:`_encode`). False
    for chat and text samples, and for a row the template refuses."""
    if not sample.completion or not tokenizer.eos_token:
        return False
    try:
        text, spans = _supervised_spans(sample.messages or (), tokenizer)
    except TemplateRefusal:
        return False
    return _reply_lacks_eos(sample, text, spans, tokenizer.eos_token)


def _reply_lacks_eos(sample: Sample, text: str, spans: list[tuple[int, int]], eos: str | None) -> bool:
    """A completion whose last reply span (of the rendered ``text``) does not hold the end-of-sequence token: the
    trial appends it there (:func:`_encode`)."""
    if not sample.completion or not eos:
        return False
    a, b = spans[-1]
    return eos not in text[a:b]


#: No text field shorter than this is ever cut before tokenizing (characters): the lengths of ordinary rows stay exact
#: at any ``max_seq_length``; a row over it (1 MB of text) is far past any useful one.
MIN_CUT_CHARS = 1_000_000

#: The fewest tokens a length audit reads of a row (``sweep doctor``, the checks before a sweep): the lengths of rows
#: longer than :func:`audit_horizon` are read as at least it.
MIN_AUDIT_HORIZON = 32768


def audit_horizon(max_seq_lengths: Sequence[int]) -> int:
    """How many tokens of each row a length audit at ``max_seq_lengths`` tokenizes: 4 times the largest (so that the
    lengths beyond it are still measured for the user's next ``max_seq_length``), at least
    :data:`MIN_AUDIT_HORIZON`. A 50 MB row took 106 s and 12.8 GB to tokenize whole (issue 48)."""
    return max(4 * max(max_seq_lengths, default=0), MIN_AUDIT_HORIZON)


def _longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of the vocabulary spells (81 in SmolLM2's: a newline and 80 spaces), so that
    ``n`` tokens never span more than ``n`` times it; cached on the tokenizer."""
    cached = getattr(tokenizer, "_sweeper_longest_token_chars", None)
    if cached is None:
        cached = max((len(token) for token in tokenizer.get_vocab()), default=1)
        try:
            tokenizer._sweeper_longest_token_chars = cached
        except AttributeError:
            pass
    return int(cached)


def _cut(sample: Sample, chars: int) -> Sample:
    """``sample`` with its text, or each message's content, cut to its first ``chars`` characters (the sample itself
    when nothing is that long)."""
    if sample.text is not None and len(sample.text) > chars:
        return dataclasses.replace(sample, text=sample.text[:chars])
    if sample.messages is not None and any(len(m["content"]) > chars for m in sample.messages):
        messages = tuple({**m, "content": m["content"][:chars]} for m in sample.messages)
        return dataclasses.replace(sample, messages=messages)
    return sample


def tokenize_samples(
    samples: Sequence[Sample], tokenizer: Any, max_seq_length: int, dropped: list[DroppedRow] | None = None
) -> list[TokenizedSample]:
    """Tokenize with the tokenizer's chat template (or :data:`DEFAULT_CHAT_TEMPLATE`), loss on replies only.

    A token is supervised when it overlaps an assistant reply or the end of its turn (offsets from the fast
    tokenizer; the template's own text, such as a default system prompt or the assistant header, is not); ``text``
    samples are supervised throughout. ``text`` rows and completions end with the end-of-sequence token (see
    :func:`_encode`). Rows longer than ``max_seq_length`` are truncated from the right (the reply's tail is cut, as
    TRL's SFTTrainer does). Text no kept token can reach is cut before tokenizing: each text field beyond twice what
    ``max_seq_length`` tokens of the vocabulary's longest token spell (:func:`_longest_token_chars`), and beyond
    :data:`MIN_CUT_CHARS`, which leaves the kept tokens as they are; a 20 MB row made every trial die of SIGABRT in
    the tokenizer under its memory cap (issue 48). ``n_tokens`` of such a row counts the cut text's tokens (``cut``):
    a lower bound, at least ``max_seq_length``.

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
    longest = _longest_token_chars(tokenizer)
    chars = max(2 * max_seq_length * longest, MIN_CUT_CHARS) if max_seq_length < sys.maxsize // (2 * longest) else None
    for sample in samples:
        kept = sample if chars is None else _cut(sample, chars)
        try:
            ids, labels = _encode(kept, tokenizer)
        except TemplateRefusal as exc:
            if dropped is not None:
                dropped.append(DroppedRow(sample.index, str(exc)))
            continue
        out.append(
            TokenizedSample(
                index=sample.index,
                input_ids=ids[:max_seq_length],
                labels=labels[:max_seq_length],
                n_tokens=len(ids),
                cut=kept is not sample,
            )
        )
    return out


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
