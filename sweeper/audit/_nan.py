"""When a finding makes a trial NaN: the first optimizer step that holds a NaN-risk row (the data order of the
trials' sampler), and the risks before a sweep (:func:`nan_risks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sweeper.audit._lengths import supervised_tokens
from sweeper.audit._report import AuditReport, Finding
from sweeper.data import TokenizedSample


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
