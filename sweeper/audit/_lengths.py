"""Token lengths and text of samples: supervised tokens, length percentiles, the longest repeated span, unusual
characters.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence

from sweeper.data import Sample

#: Longest repeating unit looked for by ``repeated_span``, in tokens.
MAX_PERIOD = 8


#: A ``repeated_span`` covers at least this many tokens and repeats its unit at least :data:`MIN_REPEATS` times.
#: Measured on the built-in pydoc corpus with SmolLM2's tokenizer (``sweep doctor search_spaces/demo.yaml``): its
#: longest periodic run is 19 tokens (24 with the tests' tiny tokenizer), so 48 flags nothing there, while a
#: three-word phrase looping 10 times is caught.
MIN_SPAN_TOKENS = 48


MIN_REPEATS = 8


#: Percentiles of the token-length distribution reported by the audit.
PERCENTILES = (50, 90, 95, 99)


#: Full-width ASCII punctuation (U+FF01-FF0F, FF1A-FF20, FF3B-FF40, FF5B-FF65) and ideographic space/comma/stop.
_FULLWIDTH_PUNCT = re.compile("[\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\u3000-\u3002]")


#: CJK ideographs, kana, hangul: text where full-width punctuation is normal.
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


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
