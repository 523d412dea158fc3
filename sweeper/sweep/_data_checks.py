"""The data refusals: what in the data would make every trial of a sweep (or the one of ``sweep trial``) measure
something other than what it says, refused before anything runs, on the data profiled once
(:class:`sweeper.audit.DataProfile`)."""

from __future__ import annotations

from typing import Any

from sweeper.errors import SpaceError
from sweeper.space import SearchSpace


def check_data(space: SearchSpace, profile: Any) -> None:
    """Refuse data no trial of ``space`` can measure as it says.

    Raises:
        SpaceError: One line, naming the file and the fix: fewer rows to train on than a searched
            ``per_device_train_batch_size`` (with packing: fewer packed rows at a searched ``max_seq_length``), each
            step would hold fewer rows and be measured, and exported, as the batch it never ran; with the audit
            (``profile.report``), no row can train at any searched ``max_seq_length`` (every trial would go NaN at
            its first step), or every reply of a chat dataset is empty (the trials would teach the model to answer
            nothing).
    """
    usable = len(profile.usable)
    batch = max(space.values_of("per_device_train_batch_size"))
    if 0 < usable < batch:
        rows = f"{usable} row{'s' if usable != 1 else ''}"
        raise SpaceError(
            f"{space.dataset.path}: dataset: {rows} to train on, fewer than per_device_train_batch_size {batch}: each "
            f"step would hold {rows} and be measured as batch {batch}; give at least {batch} samples, or search "
            f"per_device_train_batch_size up to {usable}"
        )
    if True in space.values_of("packing"):
        _check_packed_rows(space, [t.n_tokens for t in profile.tokenized], batch)
    if profile.report is not None:
        _check_trainable(space, profile)


def _check_packed_rows(space: SearchSpace, n_tokens: list[int], batch: int) -> None:
    """Refuse a packed search whose data packs into fewer rows than a searched ``per_device_train_batch_size`` at a
    searched ``max_seq_length``: a packed trial draws its batches from the packed rows
    (:func:`sweeper.data.pack_groups`), so each step would hold them all and be measured, and exported, as a batch
    it never ran. ``n_tokens``: each usable sample's tokens (at least the longest searched length when cut there).

    Raises:
        SpaceError: At the shortest searched length that packs into too few rows, with the rows it packs into.
    """
    from sweeper.data import pack_groups

    longest = max(space.values_of("max_seq_length"))
    lengths = [min(n, longest) for n in n_tokens]
    if not lengths:
        return
    for max_seq_length in sorted(space.values_of("max_seq_length")):
        rows = len(pack_groups([min(n, max_seq_length) for n in lengths], max_seq_length))
        if rows < batch:
            raise SpaceError(
                f"{space.dataset.path}: dataset: with packing, its {len(lengths)} samples ({sum(lengths):,} tokens) "
                f"pack into {rows} row{'s' if rows != 1 else ''} of max_seq_length {max_seq_length}, fewer than "
                f"per_device_train_batch_size {batch}: each step would hold {rows} and be measured as batch {batch}; "
                f"search per_device_train_batch_size up to {rows}, shorter max_seq_length, or give more samples"
            )


def _check_trainable(space: SearchSpace, profile: Any) -> None:
    """Refuse data the audit says no trial can train on: every row with a NaN fault at every searched
    ``max_seq_length`` (e.g. its reply cut away), or a chat dataset whose every reply is empty (finite losses, a
    confident margin and a safe pick, for training the model to answer nothing: issue 48).

    Raises:
        SpaceError: One line naming the file, what the audit found and the fix.
    """
    lengths = space.values_of("max_seq_length")
    report, samples, total = profile.report, profile.samples, len(profile.tokenized)
    bad = {n: set[int]() for n in lengths}
    for finding in report.nan_findings:
        for n in lengths if finding.max_seq_length is None else [finding.max_seq_length]:
            bad.setdefault(n, set()).update(finding.samples)
    if total and all(len(bad[n]) >= total for n in lengths):
        kinds = sorted({f.kind for f in report.nan_findings})
        raise SpaceError(
            f"{space.dataset.path}: dataset: none of its {total} rows can train at max_seq_length "
            f"{', '.join(map(str, sorted(set(lengths))))} ({', '.join(kinds)}): every trial would go NaN at its first "
            f"step; see '{space.doctor_command()}', then fix the data or raise max_seq_length"
        )
    replies = [
        [m["content"] for m in s.messages if m["role"] == "assistant"] for s in samples if s.messages is not None
    ]
    if total and len(replies) == len(samples) and all(not any(r.strip() for r in rs) for rs in replies):
        raise SpaceError(
            f"{space.dataset.path}: dataset: every reply of its {len(samples)} rows is empty: the trials would teach "
            f"the model to answer nothing; see '{space.doctor_command()}', then fix the data"
        )
