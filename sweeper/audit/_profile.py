"""The data profiled once per command: the tokenizer loaded once, the trials' samples tokenized once (at the audit's
horizon, :func:`sweeper.data.audit_horizon`), the rows no trial trains on, the whole file's lengths and, where the
command audits, the audit. ``sweep run``, ``sweep trial``, ``sweep estimate`` and ``sweep doctor`` each read what they
show from one :class:`DataProfile` instead of composing the tokenization their own way (issue 56: three ways, and
the tokenizer loaded twice, per command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.audit._findings import audit_samples
from sweeper.audit._report import AuditReport


@dataclass(frozen=True)
class DataProfile:
    """What a command knows of its data, measured once.

    Attributes:
        samples: The trials' samples (:func:`sweeper.data.load_samples`; ``dataset.max_samples`` of them at most).
        tokenized: ``samples`` tokenized as the trials tokenize them, at the audit's horizon (each row's
            ``n_tokens`` its true length up to it); the rows the chat template refuses are not among them.
        unused: Every dataset row no trial trains on, with its reason, by index: those the file could not give and
            those the chat template refuses (:class:`sweeper.data.DroppedRow`).
        file: The whole dataset file's sample lengths (:class:`sweeper.data.FileLengths`): the worst step and the
            "same rows" settlement are the file's, which the exports train.
        report: The audit at the command's ``max_seq_length`` values (:class:`AuditReport`), None where the command
            does not audit (``sweep trial``, ``sweep estimate``).
    """

    samples: Sequence[Any]
    tokenized: Sequence[Any]
    unused: Sequence[Any]
    file: Any
    report: AuditReport | None = None

    @property
    def usable(self) -> list[Any]:
        """The samples a trial trains on (those the chat template does not refuse)."""
        refused = {u.index for u in self.unused}
        return [s for s in self.samples if s.index not in refused]


def profile_data(
    samples: Sequence[Any],
    dataset: Any,
    model: Any,
    model_path: str,
    max_seq_lengths: Sequence[int],
    *,
    audit: bool = False,
    compute_dtypes: Sequence[str] = (),
    special_tokens: bool = False,
) -> DataProfile:
    """Profile the data a command trains on: one tokenizer load, one tokenization of ``samples``, the whole file's
    lengths (each row of the file tokenized once: :func:`sweeper.data.file_lengths`) and, with ``audit``, the audit
    at ``max_seq_lengths`` (with ``special_tokens``, the checkpoint's embedding rows of the special tokens too).

    Args:
        samples: From :func:`sweeper.data.load_samples` (its ``dropped`` rows are counted as unused).
        dataset: The space's :class:`sweeper.space.DatasetSpec`.
        model: The space's :class:`sweeper.space.ModelSpec` (``trust_remote_code``).
        model_path: The resolved local checkpoint (:func:`sweeper.model.resolve_model`).
        max_seq_lengths: The searched ``max_seq_length`` values (tokens); the horizon is 4 times the largest.
        audit: Run the audit (``sweep run``, ``sweep doctor``).
        compute_dtypes: The searched ``bnb_4bit_compute_dtype`` values, for the embedding-row check.
        special_tokens: The doctor's audit: the unused rows as findings, and the special tokens' embedding rows read
            from the checkpoint, checked at ``compute_dtypes``.

    Raises:
        DataError: The tokenizer cannot be loaded or gives no offsets, or the file changed since it was read.
    """
    from sweeper.data import audit_horizon, file_lengths, load_tokenizer, mask_disagreements, tokenize_samples
    from sweeper.model import model_vocab_size

    tokenizer = load_tokenizer(model_path, model.trust_remote_code)
    horizon = audit_horizon(max_seq_lengths)
    refused: list[Any] = []
    tokenized = tokenize_samples(samples, tokenizer, horizon, dropped=refused)
    unused = sorted([*getattr(samples, "dropped", []), *refused], key=lambda d: d.index)
    report = None
    if audit:
        from sweeper.data import special_token_rows

        checks: dict[str, Any] = {}
        if special_tokens:  # sweep doctor: the unused rows as findings, and the checkpoint's special-token rows
            checks = {
                "dropped": unused,
                "special_tokens": special_token_rows(model_path, tokenizer) or [],
                "compute_dtypes": list(compute_dtypes),
            }
        report = audit_samples(
            samples,
            tokenized,
            list(max_seq_lengths),
            model_vocab_size(model_path, model.trust_remote_code),
            mask_disagreements=mask_disagreements(samples, tokenizer),
            **checks,
        )
    file = file_lengths(dataset, tokenizer, horizon, tokenized, samples)
    if audit and file.cut:
        file = _with_repeated_spans(file, dataset, tokenizer, horizon)
    return DataProfile(samples, tokenized, unused, file, report)


#: How many of the file's longest rows outside the trials' sample :func:`profile_data` checks for a repeated span:
#: the rows that set the worst step, read again (a few rows, not the file: a span check is 8 passes over a row).
LONGEST_ROWS_CHECKED = 5


def _with_repeated_spans(file: Any, dataset: Any, tokenizer: Any, horizon: int) -> Any:
    """``file`` with its :attr:`~sweeper.data.FileLengths.repeated_spans`: of its :data:`LONGEST_ROWS_CHECKED`
    longest rows outside the trials' sample and longer than any sampled row, those that repeat one unit over
    :data:`~sweeper.audit._lengths.MIN_SPAN_TOKENS`+ tokens (the audit's ``repeated_span`` rule, issue 68: a reply of
    one token repeated 5,000 times was named only by ``sweep doctor FILE``)."""
    from dataclasses import replace

    from sweeper.audit._lengths import MIN_REPEATS, MIN_SPAN_TOKENS, longest_repeated_span
    from sweeper.data import file_samples, tokenize_samples

    sampled = {i for i, _ in file.lengths[: file.sampled]}
    outside = [(n, i) for i, n in file.lengths if i not in sampled and n > file.sampled_longest]
    longest = [i for _, i in sorted(outside, reverse=True)[:LONGEST_ROWS_CHECKED]]
    if not longest:
        return file
    spans = []
    for t in tokenize_samples(file_samples(dataset, longest), tokenizer, horizon):
        span, period, _ = longest_repeated_span(t.input_ids)
        if span >= MIN_SPAN_TOKENS and span // period >= MIN_REPEATS:
            spans.append((t.index, span))
    return replace(file, repeated_spans=tuple(sorted(spans, key=lambda s: -s[1])))
