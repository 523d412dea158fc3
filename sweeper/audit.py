"""Dataset audit: what in the data, tokenized exactly as the trials tokenize it, would make a trial NaN, run out of
memory or learn the wrong thing (``sweep doctor``, and the check ``sweep run`` makes before its first trial).

Pure: works on :class:`~sweeper.data.Sample` and :class:`~sweeper.data.TokenizedSample` lists (tokenized once at
full length, then cut per ``max_seq_length`` as :func:`sweeper.data.tokenize_samples` cuts) and never imports torch.

Finding kinds (``Finding.kind``):

- ``no_supervised_tokens`` (per ``max_seq_length``): after truncation the sample has no token the loss is computed
  on. A step whose rows all are like that averages cross-entropy over zero tokens: the loss is 0/0 = NaN. NaN risk.
- ``invalid_token_id`` (per ``max_seq_length``): a token id outside the model's embedding (a tokenizer with added
  tokens the model was never resized for). An index error on the CPU, a device-side assert on CUDA. NaN risk.
- ``bad_embedding_row``: a special token the trials use (pad, eos, bos) whose input-embedding row in the checkpoint
  is NaN or infinite, or beyond float16's range when float16 compute is searched (the model loads in the compute
  dtype). Every row holding it or padded with it goes NaN: a masked position still enters attention with weight 0,
  and 0 x NaN is NaN (unsloth#4104). NaN risk.
- ``truncated`` (per ``max_seq_length``): samples longer than the limit; their tails are not trained on.
- ``too_long``: extreme outliers of the token-length distribution (beyond Tukey's far-out fence), the samples that
  set the memory peak of a run that pads to the longest row.
- ``repeated_span``: a run of one token, or of one n-gram of up to :data:`MAX_PERIOD` tokens, repeated many times
  (scraped boilerplate, a generation loop saved as data).
- ``empty_response``: an assistant reply that is empty or whitespace: the model is taught to answer nothing.
- ``duplicate``: samples with the same content (after collapsing whitespace).
- ``unusual_characters``: control characters, U+FFFD replacement characters (a decoding error upstream), or
  full-width punctuation in text that has no CJK characters (copy-paste from an IME).
- ``dropped_row`` (one per reason): dataset rows that give no sample (:class:`sweeper.data.DroppedRow`): a trial
  does not train on them. Indices are the rows'; ``samples`` of the report does not count them.
- ``generation_mask``: the chat template's ``{% generation %}`` markers supervise other tokens than the assistant
  replies and their end of turn (:func:`sweeper.data.mask_disagreements`); the trials train what the markers say,
  as TRL's ``assistant_only_loss`` does.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sweeper.data import DroppedRow, Sample, SpecialTokenRow, TokenizedSample
from sweeper.stability import DTYPE_MAX  # largest finite value per compute dtype, for bad_embedding_row

FindingKind = Literal[
    "no_supervised_tokens",
    "invalid_token_id",
    "truncated",
    "too_long",
    "repeated_span",
    "empty_response",
    "duplicate",
    "unusual_characters",
    "dropped_row",
    "bad_embedding_row",
    "generation_mask",
]

#: Kinds that make a trial NaN (or crash) when a step consists of such samples; ``sweep doctor --strict`` exits 1.
NAN_KINDS = ("no_supervised_tokens", "invalid_token_id", "bad_embedding_row")
#: Longest repeating unit looked for by ``repeated_span``, in tokens.
MAX_PERIOD = 8
#: A ``repeated_span`` covers at least this many tokens and repeats its unit at least :data:`MIN_REPEATS` times.
#: Measured on the built-in pydoc corpus with SmolLM2's tokenizer (``sweep doctor search_spaces/demo.yaml``): its
#: longest periodic run is 19 tokens (24 with the tests' tiny tokenizer), so 48 flags nothing there, while a
#: three-word phrase looping 10 times is caught.
MIN_SPAN_TOKENS = 48
MIN_REPEATS = 8
#: ``too_long``: longer than ``Q3 + TUKEY_FAR_OUT * (Q3 - Q1)`` tokens (Tukey 1977, "far out" values) and than
#: ``TOO_LONG_MEDIAN_RATIO`` times the median: where nearly every row has one length the IQR is 0 and Tukey's fence
#: alone flags a row 2 tokens over; a row sets a padded batch's memory only when it is much longer than the rest.
TUKEY_FAR_OUT = 3.0
TOO_LONG_MEDIAN_RATIO = 2.0
#: Percentiles of the token-length distribution reported by the audit.
PERCENTILES = (50, 90, 95, 99)

#: Full-width ASCII punctuation (U+FF01-FF0F, FF1A-FF20, FF3B-FF40, FF5B-FF65) and ideographic space/comma/stop.
_FULLWIDTH_PUNCT = re.compile("[\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\u3000-\u3002]")
#: CJK ideographs, kana, hangul: text where full-width punctuation is normal.
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One kind of fault and the samples that have it.

    Attributes:
        kind: See the module docstring.
        max_seq_length: The limit it was found at, or None for length-independent kinds.
        samples: Dataset row indices (``Sample.index``), ascending.
        detail: One line for people (counts, the worst case).
        nan_risk: True for :data:`NAN_KINDS`.
    """

    kind: FindingKind
    max_seq_length: int | None
    samples: list[int]
    detail: str
    nan_risk: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"kind", "max_seq_length", "samples", "detail", "nan_risk"}``."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    """What :func:`audit_samples` found.

    Attributes:
        samples: Samples audited.
        length_percentiles: Tokens per sample before truncation (template included): ``min``, ``p50``, ``p90``,
            ``p95``, ``p99``, ``max``, ``mean``.
        max_seq_lengths: The limits audited, ascending.
        vocab_size: Rows of the model's input embedding the ids were checked against, or None (not checked).
        findings: In the order of the module docstring's kinds, then by ``max_seq_length``.
    """

    samples: int
    length_percentiles: dict[str, float]
    max_seq_lengths: list[int]
    vocab_size: int | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def nan_findings(self) -> list[Finding]:
        """The findings that make a trial NaN when a step consists of their samples."""
        return [f for f in self.findings if f.nan_risk]

    def to_dict(self) -> dict[str, Any]:
        """``{"samples": N, "length_percentiles": {...}, "max_seq_lengths": [...], "vocab_size": V,
        "findings": [{"kind", "max_seq_length", "samples", "detail", "nan_risk"}]}``."""
        return {
            "samples": self.samples,
            "length_percentiles": self.length_percentiles,
            "max_seq_lengths": self.max_seq_lengths,
            "vocab_size": self.vocab_size,
            "findings": [f.to_dict() for f in self.findings],
        }


def supervised_tokens(labels: Sequence[int], max_seq_length: int) -> int:
    """Tokens the loss is computed on within the first ``max_seq_length``: ``labels[1:max_seq_length] != -100``.

    Position 0 is never a target: causal-LM losses shift labels left by one (transformers'
    ``ForCausalLMLoss``; ``Trainer`` counts ``num_items_in_batch`` over ``labels[..., 1:]``).
    """
    return sum(1 for t in labels[1:max_seq_length] if t != -100)


def _percentile(sorted_values: Sequence[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method), ``q`` in [0, 100]."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def length_percentiles(lengths: Iterable[int]) -> dict[str, float]:
    """``min``, ``p50``, ``p90``, ``p95``, ``p99``, ``max`` and ``mean`` of token counts (empty input: {})."""
    values = sorted(lengths)
    if not values:
        return {}
    out = {"min": float(values[0])}
    out.update({f"p{q}": round(_percentile(values, q), 1) for q in PERCENTILES})
    out["max"] = float(values[-1])
    out["mean"] = round(sum(values) / len(values), 1)
    return out


def longest_repeated_span(ids: Sequence[int], max_period: int = MAX_PERIOD) -> tuple[int, int, int]:
    """The longest stretch of ``ids`` that repeats one unit of 1..``max_period`` tokens back to back.

    Returns:
        ``(span_tokens, period, start)``: tokens covered, unit length, first position; ``(0, 0, 0)`` when no unit
        repeats. A stretch of period p satisfies ``ids[i] == ids[i + p]`` for ``span_tokens - p`` consecutive i; the
        smallest period wins a tie (a run of one token is also periodic with period 2).
    """
    best = (0, 0, 0)
    n = len(ids)
    for p in range(1, max_period + 1):
        run = 0
        for i in range(n - p):
            if ids[i] == ids[i + p]:
                run += 1
                if run + p > best[0]:
                    best = (run + p, p, i - run + 1)
            else:
                run = 0
    return best


def _unusual_characters(text: str) -> list[str]:
    """What is unusual in ``text``: names of the character classes found (empty when clean)."""
    found = []
    if any(unicodedata.category(c) == "Cc" and c not in "\t\n\r" for c in text):
        found.append("control characters")
    if "\ufffd" in text:
        found.append("U+FFFD replacement characters")
    if _FULLWIDTH_PUNCT.search(text) and not _CJK.search(text):
        found.append("full-width punctuation in half-width text")
    return found


def _sample_text(sample: Sample) -> str:
    if sample.text is not None:
        return sample.text
    return "\n".join(m["content"] for m in sample.messages or ())


def _content_key(sample: Sample) -> tuple:
    if sample.text is not None:
        return ("text", " ".join(sample.text.split()))
    return tuple((m["role"], " ".join(m["content"].split())) for m in sample.messages or ())


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
                    f"(longest {max(t.n_tokens for t in tokenized)}): {_examples(longer)}",
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
            f"median {median:.0f}); longest: sample {outliers[0].index} with "
            f"{outliers[0].n_tokens} tokens",
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


@dataclass(frozen=True, kw_only=True)
class NanStep:
    """A step of a trial that the data alone makes NaN.

    Attributes:
        step: 1-based optimizer step.
        samples: Dataset indices of the step's rows.
        kind: ``no_supervised_tokens`` (no row has a supervised token) or ``invalid_token_id`` (some row has one).
    """

    step: int
    samples: list[int]
    kind: str


def first_nan_step(
    tokenized: Sequence[TokenizedSample],
    max_seq_length: int,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    max_steps: int,
    vocab_size: int | None = None,
) -> NanStep | None:
    """The first step within ``max_steps`` that goes NaN for a data reason alone, reading samples as a trial does.

    A trial reads its samples in order (``sweeper.trial._child.worker`` uses a sequential sampler), in micro-batches of
    ``per_device_train_batch_size`` rows (the last one of an epoch shorter), ``gradient_accumulation_steps``
    micro-batches per optimizer step (the last step of an epoch takes what is left, as ``Trainer`` does), and starts
    over when the data runs out. A step's loss is averaged over all its supervised tokens, so it is NaN when none of
    its rows has one; an out-of-vocabulary id fails its step alone.

    Args:
        tokenized: Full-length tokenization in trial order (as for :func:`audit_samples`).
        max_seq_length: The trial's limit.
        per_device_train_batch_size: >= 1.
        gradient_accumulation_steps: >= 1.
        max_steps: Steps the trial runs.
        vocab_size: Embedding rows, or None to skip the id check.

    Returns:
        The first such step, or None.
    """
    epoch = _epoch_steps(tokenized, per_device_train_batch_size, gradient_accumulation_steps)
    if not epoch:
        return None
    for step in range(min(max_steps, len(epoch))):  # later epochs repeat the same steps
        rows = epoch[step]
        if vocab_size is not None:
            bad = [t.index for t in rows if any(i >= vocab_size or i < 0 for i in t.input_ids[:max_seq_length])]
            if bad:
                return NanStep(step=step + 1, samples=bad, kind="invalid_token_id")
        if all(supervised_tokens(t.labels, max_seq_length) == 0 for t in rows):
            return NanStep(step=step + 1, samples=[t.index for t in rows], kind="no_supervised_tokens")
    return None


def _epoch_steps(
    tokenized: Sequence[TokenizedSample], per_device_train_batch_size: int, gradient_accumulation_steps: int
) -> list[list[TokenizedSample]]:
    """The rows of each optimizer step of one epoch, read as a trial reads them (see :func:`first_nan_step`)."""
    batches = [
        tokenized[i : i + per_device_train_batch_size] for i in range(0, len(tokenized), per_device_train_batch_size)
    ]
    return [
        [row for b in batches[i : i + gradient_accumulation_steps] for row in b]
        for i in range(0, len(batches), gradient_accumulation_steps)
    ]


def first_step_with(
    tokenized: Sequence[TokenizedSample],
    samples: Iterable[int],
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    max_steps: int,
    kind: str,
) -> NanStep | None:
    """The first step within ``max_steps`` that holds one of ``samples`` (dataset indices), as a ``kind`` NaN step:
    for faults that fail any step with such a row (``bad_embedding_row``)."""
    wanted = set(samples)
    epoch = _epoch_steps(tokenized, per_device_train_batch_size, gradient_accumulation_steps)
    for step in range(min(max_steps, len(epoch))):
        hit = [t.index for t in epoch[step] if t.index in wanted]
        if hit:
            return NanStep(step=step + 1, samples=hit, kind=kind)
    return None


@dataclass(frozen=True, kw_only=True)
class NanRisk:
    """A finding that would make trials NaN, and where it strikes in the sweep.

    Attributes:
        finding: The audit's finding (``no_supervised_tokens`` or ``invalid_token_id`` at one ``max_seq_length``).
        strikes: The first NaN step per ``(per_device_train_batch_size, gradient_accumulation_steps)`` of the sweep
            at which a step is made only of such samples within ``max_steps``; empty when none is.
        max_steps: The longest run of the sweep, in steps.
    """

    finding: Finding
    strikes: dict[tuple[int, int], NanStep]
    max_steps: int


def nan_risks(
    report: AuditReport,
    tokenized: Sequence[TokenizedSample],
    batch_sizes: Sequence[int],
    accumulation_steps: Sequence[int],
    max_steps: int,
) -> list[NanRisk]:
    """For each finding of ``report`` that would make a trial NaN, the batch shapes of the sweep where it strikes
    (:func:`first_nan_step`), so that a data fault is never read as a hyperparameter result."""
    out = []
    for finding in report.nan_findings:
        strikes = {}
        for b in batch_sizes:
            for ga in accumulation_steps:
                if finding.max_seq_length is None:
                    hit = first_step_with(tokenized, finding.samples, b, ga, max_steps, finding.kind)
                else:
                    hit = first_nan_step(tokenized, finding.max_seq_length, b, ga, max_steps, report.vocab_size)
                if hit is not None and hit.kind == finding.kind:
                    strikes[(b, ga)] = hit
        out.append(NanRisk(finding=finding, strikes=strikes, max_steps=max_steps))
    return out
