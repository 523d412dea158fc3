"""The audit of a dataset as the trials tokenize it (:func:`audit_samples`): each kind of finding, per audited
``max_seq_length``, and the rows no trial trains on (:func:`dropped_findings`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from sweeper.audit._lengths import (
    MAX_PERIOD,
    MIN_REPEATS,
    MIN_SPAN_TOKENS,
    _content_key,
    _percentile,
    _sample_text,
    _unusual_characters,
    length_percentiles,
    longest_repeated_span,
    supervised_tokens,
)
from sweeper.audit._report import AuditReport, Finding
from sweeper.data import DroppedRow, Sample, SpecialTokenRow, TokenizedSample
from sweeper.stability import DTYPE_MAX

#: ``too_long``: longer than ``Q3 + TUKEY_FAR_OUT * (Q3 - Q1)`` tokens (Tukey 1977, "far out" values) and than
#: ``TOO_LONG_MEDIAN_RATIO`` times the median: where nearly every row has one length the IQR is 0 and Tukey's fence
#: alone flags a row 2 tokens over; a row sets a padded batch's memory only when it is much longer than the rest.
TUKEY_FAR_OUT = 3.0


TOO_LONG_MEDIAN_RATIO = 2.0


def _samples(n: int, total: int | None = None, verb: tuple[str, str] | None = None) -> str:
    """``1 sample``, ``3 samples`` or ``3 of 8 samples``, then ``verb`` (singular, plural) agreeing with ``n``."""
    text = f"{n} of {total} samples" if total is not None else f"{n} sample" + ("s" if n != 1 else "")
    return text + (f" {verb[0] if n == 1 else verb[1]}" if verb else "")


def _percent(part: int, whole: int) -> str:
    """``84%``, or one decimal below 1% (``0.3%``) so that a few samples never read as none."""
    share = 100 * part / whole
    return f"{share:.0f}%" if share >= 1 or share == 0 else f"{share:.1f}%"


def _examples(indices: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")


def audit_samples(
    samples: Sequence[Sample],
    tokenized: Sequence[TokenizedSample],
    max_seq_lengths: Iterable[int],
    vocab_size: int | None = None,
    *,
    dropped: Sequence[DroppedRow] = (),
    special_tokens: Sequence[SpecialTokenRow] = (),
    compute_dtypes: Sequence[str] = ("bfloat16", "float16", "float32"),
    mask_disagreements: Sequence[int] = (),
) -> AuditReport:
    """Audit samples as the trials would see them at each ``max_seq_length``.

    Args:
        samples: From :func:`sweeper.data.load_samples`, in trial order.
        tokenized: The same samples through :func:`sweeper.data.tokenize_samples` with a ``max_seq_length`` at
            least as long as the longest sample (so nothing is cut yet), in the same order.
        max_seq_lengths: Limits to audit (each >= 2); duplicates are merged.
        vocab_size: Rows of the model's input embedding (``config.vocab_size``), or None to skip
            ``invalid_token_id``.
        dropped: Rows of the dataset that give no sample (:func:`sweeper.data.unused_rows`): ``dropped_row``.
        special_tokens: :func:`sweeper.data.special_token_rows` of the checkpoint: ``bad_embedding_row``.
        compute_dtypes: The ``bnb_4bit_compute_dtype`` values the trials use (a row beyond float16's range matters
            only to float16 trials).
        mask_disagreements: :func:`sweeper.data.mask_disagreements`: ``generation_mask``.

    Returns:
        The report; ``findings`` is empty for a clean dataset.

    Raises:
        ValueError: ``tokenized`` does not follow ``samples``' order (samples left out of ``tokenized``, such as rows
            the chat template refuses, are left out of the audit too).
    """
    kept = {t.index for t in tokenized}
    samples = [s for s in samples if s.index in kept]
    if [s.index for s in samples] != [t.index for t in tokenized]:
        raise ValueError("samples and tokenized must hold the same samples in the same order")
    lengths = sorted(set(max_seq_lengths))
    findings = [  # the module docstring's order
        *_no_supervised_findings(tokenized, lengths),
        *_invalid_id_findings(tokenized, lengths, vocab_size),
        *_embedding_findings(special_tokens, tokenized, lengths, compute_dtypes),
        *_truncated_findings(tokenized, lengths),
        *_too_long_findings(tokenized),
        *_repeated_span_findings(tokenized),
        *_empty_response_findings(samples),
        *_duplicate_findings(samples),
        *_unusual_characters_findings(samples),
        *dropped_findings(dropped),
        *_generation_mask_findings(mask_disagreements, len(tokenized)),
    ]
    return AuditReport(
        samples=len(samples),
        length_percentiles=length_percentiles(t.n_tokens for t in tokenized),
        max_seq_lengths=lengths,
        vocab_size=vocab_size,
        findings=findings,
    )


def _no_supervised_findings(tokenized: Sequence[TokenizedSample], lengths: Sequence[int]) -> list[Finding]:
    """``no_supervised_tokens`` per limit: samples with no supervised token left after truncation."""
    out = []
    for limit in lengths:
        emptied = [t for t in tokenized if supervised_tokens(t.labels, limit) == 0]
        if not emptied:
            continue
        cut = sorted(t.index for t in emptied)
        first = min(next((i for i, x in enumerate(t.labels) if x != -100), t.n_tokens) for t in emptied)
        why = (
            f"the reply starts at token {first} or later"
            if first > 0
            else "rows of one token: after the causal shift nothing is left to predict"
        )
        out.append(
            Finding(
                kind="no_supervised_tokens",
                max_seq_length=limit,
                samples=cut,
                nan_risk=True,
                detail=f"{_samples(len(cut), len(tokenized), ('keeps', 'keep'))} no supervised token within "
                f"{limit} "
                f"tokens ({why}): {_examples(cut)}; a step made only of such samples has a NaN loss",
            )
        )
    return out


def _invalid_id_findings(
    tokenized: Sequence[TokenizedSample], lengths: Sequence[int], vocab_size: int | None
) -> list[Finding]:
    """``invalid_token_id`` per limit: samples holding an id outside ``vocab_size`` rows (none when it is None)."""
    if vocab_size is None:
        return []
    out = []
    for limit in lengths:
        bad = {
            t.index: max(i for i in t.input_ids[:limit] if i >= vocab_size or i < 0)
            for t in tokenized
            if any(i >= vocab_size or i < 0 for i in t.input_ids[:limit])
        }
        if not bad:
            continue
        worst = max(bad.values())
        out.append(
            Finding(
                kind="invalid_token_id",
                max_seq_length=limit,
                samples=sorted(bad),
                nan_risk=True,
                detail=f"{_samples(len(bad), verb=('holds', 'hold'))} token ids outside the model's "
                f"{vocab_size} "
                f"embedding rows (largest {worst}): {_examples(sorted(bad))}; the tokenizer has tokens the "
                "model was not resized for (model.resize_token_embeddings), or the data holds raw ids",
            )
        )
    return out


def _truncated_findings(tokenized: Sequence[TokenizedSample], lengths: Sequence[int]) -> list[Finding]:
    """``truncated`` per limit: samples longer than it."""
    out = []
    for limit in lengths:
        longer = sorted(t.index for t in tokenized if t.n_tokens > limit)
        if longer:
            out.append(
                Finding(
                    kind="truncated",
                    max_seq_length=limit,
                    samples=longer,
                    detail=f"{_samples(len(longer), len(tokenized))} ({_percent(len(longer), len(tokenized))}) "
                    f"{'is' if len(longer) == 1 else 'are'} longer than {limit} tokens and "
                    f"{'loses its' if len(longer) == 1 else 'lose their'} tail "
                    f"(longest {_length(max(tokenized, key=lambda t: t.n_tokens))}): {_examples(longer)}",
                )
            )
    return out


def _too_long_findings(tokenized: Sequence[TokenizedSample]) -> list[Finding]:
    """``too_long``: samples beyond Tukey's far-out fence and :data:`TOO_LONG_MEDIAN_RATIO` times the median (at
    least 4 samples)."""
    ordered = sorted(t.n_tokens for t in tokenized)
    if len(ordered) < 4:
        return []
    q1, q3 = _percentile(ordered, 25), _percentile(ordered, 75)
    median = _percentile(ordered, 50)
    fence = max(q3 + TUKEY_FAR_OUT * (q3 - q1), TOO_LONG_MEDIAN_RATIO * median)
    outliers = sorted((t for t in tokenized if t.n_tokens > fence), key=lambda t: -t.n_tokens)
    if not outliers:
        return []
    return [
        Finding(
            kind="too_long",
            max_seq_length=None,
            samples=sorted(t.index for t in outliers),
            detail=f"{_samples(len(outliers), verb=('is', 'are'))} longer than {fence:.0f} tokens "
            f"(Q3 + {TUKEY_FAR_OUT:g} IQR, at least {TOO_LONG_MEDIAN_RATIO:g}x the "
            f"median {median:.0f}); longest: sample {outliers[0].index} with {_length(outliers[0])} tokens",
        )
    ]


def _repeated_span_findings(tokenized: Sequence[TokenizedSample]) -> list[Finding]:
    """``repeated_span``: samples with a periodic run of :data:`MIN_SPAN_TOKENS`+ tokens, :data:`MIN_REPEATS`+
    repeats."""
    spans = []  # (index, span_tokens, period, start)
    for t in tokenized:
        span, period, start = longest_repeated_span(t.input_ids)
        if span >= MIN_SPAN_TOKENS and span // period >= MIN_REPEATS:
            spans.append((t.index, span, period, start))
    if not spans:
        return []
    index, span, period, start = max(spans, key=lambda s: s[1])
    return [
        Finding(
            kind="repeated_span",
            max_seq_length=None,
            samples=sorted(s[0] for s in spans),
            detail=f"{_samples(len(spans), verb=('repeats', 'repeat'))} a unit of at most {MAX_PERIOD} tokens "
            f"over {MIN_SPAN_TOKENS}+ "
            f"tokens; longest: sample {index}, a {period}-token unit {span // period} times from "
            f"token {start}",
        )
    ]


def _empty_response_findings(samples: Sequence[Sample]) -> list[Finding]:
    """``empty_response``: chat samples with an empty or whitespace assistant reply."""
    empty = sorted(
        s.index
        for s in samples
        if s.messages is not None and any(m["role"] == "assistant" and not m["content"].strip() for m in s.messages)
    )
    if not empty:
        return []
    return [
        Finding(
            kind="empty_response",
            max_seq_length=None,
            samples=empty,
            detail=f"{_samples(len(empty))} with an empty assistant reply: {_examples(empty)}",
        )
    ]


def _duplicate_findings(samples: Sequence[Sample]) -> list[Finding]:
    """``duplicate``: groups of samples with the same content after collapsing whitespace."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for s in samples:
        groups[_content_key(s)].append(s.index)
    dupes = sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: g[0])
    if not dupes:
        return []

    def group(g: list[int]) -> str:  # every index counted: the ones not shown as "and N more"
        return " = ".join(str(i) for i in g[:4]) + (f" and {len(g) - 4} more" if len(g) > 4 else "")

    shown = "; ".join(group(g) for g in dupes[:3])
    return [
        Finding(
            kind="duplicate",
            max_seq_length=None,
            samples=sorted(i for g in dupes for i in g),
            detail=f"{len(dupes)} group{'s' if len(dupes) > 1 else ''} of identical samples "
            f"({sum(len(g) for g in dupes)} samples): {shown}"
            + (f"; and {len(dupes) - 3} more group{'s' if len(dupes) > 4 else ''}" if len(dupes) > 3 else ""),
        )
    ]


def _unusual_characters_findings(samples: Sequence[Sample]) -> list[Finding]:
    """``unusual_characters``: samples whose text holds what :func:`_unusual_characters` finds."""
    odd: dict[int, list[str]] = {}
    for s in samples:
        found = _unusual_characters(_sample_text(s))
        if found:
            odd[s.index] = found
    if not odd:
        return []
    kinds = sorted({k for v in odd.values() for k in v})
    return [
        Finding(
            kind="unusual_characters",
            max_seq_length=None,
            samples=sorted(odd),
            detail=f"{_samples(len(odd), verb=('holds', 'hold'))} {', '.join(kinds)}: {_examples(sorted(odd))}",
        )
    ]


def _generation_mask_findings(mask_disagreements: Sequence[int], total: int) -> list[Finding]:
    """``generation_mask``: samples whose ``{% generation %}`` markers supervise other tokens than the replies
    (``total``: samples audited)."""
    differ = sorted(set(mask_disagreements))
    if not differ:
        return []
    return [
        Finding(
            kind="generation_mask",
            max_seq_length=None,
            samples=differ,
            detail=f"{_samples(len(differ), total)}: the chat template's {{% generation %}} markers "
            "supervise other tokens than the assistant replies and their end of turn; the trials train what the "
            f"markers say, as TRL's assistant_only_loss does: {_examples(differ)}",
        )
    ]


def dropped_findings(dropped: Sequence[DroppedRow]) -> list[Finding]:
    """One ``dropped_row`` finding per reason, the most frequent first, with the rows' indices."""
    groups: dict[str, list[int]] = defaultdict(list)
    for d in dropped:
        groups[d.reason].append(d.index)
    return [
        Finding(
            kind="dropped_row",
            max_seq_length=None,
            samples=sorted(indices),
            detail=f"{len(indices)} row{'s' if len(indices) != 1 else ''} not trained on: {reason}: "
            f"{_examples(sorted(indices))}",
        )
        for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    ]


def _embedding_findings(
    special_tokens: Sequence[SpecialTokenRow],
    tokenized: Sequence[TokenizedSample],
    lengths: Sequence[int],
    compute_dtypes: Sequence[str],
) -> list[Finding]:
    """``bad_embedding_row``: special tokens whose embedding row is non-finite, or beyond the range of a searched
    compute dtype; the samples are those holding the token, and for the pad token those padded at the longest
    audited ``max_seq_length`` (the collator pads every row to it)."""
    out = []
    longest = max(lengths) if lengths else 0
    for row in special_tokens:
        if math.isfinite(row.max_abs):
            over = [d for d in compute_dtypes if row.max_abs > DTYPE_MAX.get(d, math.inf)]
            if not over:
                continue
            what = (
                f"reaches {row.max_abs:.3g}, beyond {'/'.join(over)}'s largest value {DTYPE_MAX[over[0]]:g}: it "
                f"becomes inf when a {'/'.join(over)} trial loads the model"
            )
        else:
            what = f"holds {'NaN' if math.isnan(row.max_abs) else 'inf'}"
        holders = {t.index for t in tokenized if row.id in t.input_ids[:longest]}
        padded = {t.index for t in tokenized if "pad" in row.roles and t.n_tokens < longest}
        affected = sorted(holders | padded)
        reach = []
        if padded:
            reach.append(f"it pads {_samples(len(padded))} at max_seq_length {longest}")
        if holders:
            reach.append(f"{_samples(len(holders), verb=('holds', 'hold'))} it")
        out.append(
            Finding(
                kind="bad_embedding_row",
                max_seq_length=None,
                samples=affected,
                nan_risk=True,
                detail=f"the {'/'.join(row.roles)} token {row.token!r} (id {row.id}): its embedding row in the "
                f"checkpoint {what}; {', '.join(reach) or 'no sample uses it'}, and a step with such a row goes NaN "
                "(a masked position still enters attention with weight 0, and 0 x NaN is NaN); fix that row of the "
                "checkpoint, or set another pad token",
            )
        )
    return out


def _length(t: TokenizedSample) -> str:
    """A row's token count as the audit read it: ``977766`` exactly, or ``at least 977766`` for a row cut before
    tokenizing (:attr:`sweeper.data.TokenizedSample.cut`)."""
    return f"at least {t.n_tokens}" if t.cut else str(t.n_tokens)
