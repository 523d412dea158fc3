"""What the audit finds: the kinds of finding (those that make a trial NaN apart), one finding with its examples, and
the report of a dataset at the audited ``max_seq_length`` values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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
