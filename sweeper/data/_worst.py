"""The worst step of the data a production run trains: the whole dataset file, not the ``max_samples`` the trials
sample from it (issue 55). The exports train every row of the file (axolotl's and LLaMA-Factory's ``rows.jsonl``)
or whatever the user hands them, so a trial that judged its memory on the longest of 16 sampled rows (609 tokens on
the built-in data) under-states an exported run whose file's longest row is 1,320 tokens by about half of its peak
(docs/trial.md). :class:`FileLengths` holds every sample's length, tokenized once per command, and names the samples
of the file's worst step at any ``max_seq_length``, batch and collation; the trial builds that step from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweeper.data._load import load_samples
from sweeper.data._samples import Sample, TokenizedSample, pack_groups
from sweeper.data._tokenize import tokenize_samples

#: ``max_samples`` that reads every sample of a file (the schema's own bound).
WHOLE_FILE = 10**9

#: :attr:`FileLengths.first_targets` of a sample with no supervised token within the audit's horizon.
NO_TARGET = 2**31


def first_target(labels: Sequence[int]) -> int:
    """The position of the first token a causal-LM loss predicts (labels shift left by one, so position 0 is never
    a target: :func:`sweeper.audit._lengths.supervised_tokens`), :data:`NO_TARGET` when there is none."""
    return next((i for i in range(1, len(labels)) if labels[i] != -100), NO_TARGET)


@dataclass(frozen=True)
class FileLengths:
    """Every sample of the dataset file with its tokens, in the trials' order (the study's shuffle).

    Attributes:
        lengths: ``(dataset index, tokens)`` per sample of the whole file, tokens as the trials tokenize it up to the
            audit's horizon (:func:`sweeper.data.audit_horizon`; a row cut there counts as that long: at least any
            searched ``max_seq_length``).
        sampled: The samples the trials train on (``dataset.max_samples`` of them), ``<= len(lengths)``.
        sampled_longest: The longest of those, in tokens (0 without samples).
        first_targets: ``(dataset index, position)`` per sample, in the order of ``lengths``: the position of its
            first supervised token that a causal-LM loss predicts (the first ``i >= 1`` whose label is not ``-100``;
            :data:`NO_TARGET` when none lies within the audit's horizon). A sample keeps no supervised token within
            ``max_seq_length`` exactly when that position is ``>= max_seq_length`` (:meth:`untrained_rows`). Empty
            for lengths recorded without it.
        repeated_spans: ``(dataset index, tokens)`` of the file's longest rows outside the trials' sample that repeat
            one unit over that many tokens (the audit's ``repeated_span``, checked by
            :func:`sweeper.audit.profile_data` on the few longest such rows: what sets the worst step); empty when
            none was found or checked.
    """

    lengths: tuple[tuple[int, int], ...]
    sampled: int
    sampled_longest: int
    first_targets: tuple[tuple[int, int], ...] = ()
    repeated_spans: tuple[tuple[int, int], ...] = ()

    def untrained_rows(self, max_seq_length: int) -> list[int]:
        """The dataset indices of the file's samples with no supervised token within ``max_seq_length`` (their
        reply starts at or past it, or they have none): a step made only of such samples averages its loss over
        zero tokens, a NaN (issue 68). Ascending."""
        return sorted(i for i, first in self.first_targets if first >= max_seq_length)

    @property
    def longest(self) -> int:
        """The file's longest sample in tokens (0 without samples): what ``max_seq_length`` is compared with to tell
        lengths that train the same rows (:meth:`sweeper.space.TrialConfig.worst_case_length`)."""
        return max((n for _, n in self.lengths), default=0)

    @property
    def longest_row(self) -> int | None:
        """The dataset index of the file's longest sample (the first of equals), None without samples."""
        return max(self.lengths, key=lambda row: row[1])[0] if self.lengths else None

    @property
    def tokens(self) -> int:
        """The file's tokens in all (each sample up to the audit's horizon): the most a packed row can hold."""
        return sum(n for _, n in self.lengths)

    @property
    def cut(self) -> bool:
        """The trials train on fewer samples than the file holds: their worst step is built from the file's samples
        (:meth:`worst_step`) instead of their own."""
        return self.sampled < len(self.lengths)

    def worst_step(self, max_seq_length: int, batch_size: int, packing: bool) -> list[list[int]]:
        """The dataset indices of the file's worst step at this length, batch and collation, a row at a time, the
        longest row first: padded, the ``batch_size`` longest samples (each cut to ``max_seq_length``), one to a
        row; packed, the ``batch_size`` longest rows that :func:`sweeper.data.pack_groups` makes of the whole file
        in the trials' order. Fewer rows when the file has fewer.

        Raises:
            ValueError: ``max_seq_length`` or ``batch_size`` below 1.
        """
        if max_seq_length < 1 or batch_size < 1:
            raise ValueError(f"need max_seq_length and batch_size >= 1, got {max_seq_length} and {batch_size}")
        cut = [min(n, max_seq_length) for _, n in self.lengths]
        if packing:
            groups = pack_groups([max(n, 1) for n in cut], max_seq_length)
        else:
            groups = [[i] for i in range(len(cut))]
        tokens = [sum(cut[i] for i in group) for group in groups]
        order = sorted(range(len(groups)), key=lambda g: (-tokens[g], g))[:batch_size]
        return [[self.lengths[i][0] for i in groups[g]] for g in order]

    def trial_worst_step(self, max_seq_length: int, batch_size: int, packing: bool) -> list[list[int]] | None:
        """What a trial's job names as its worst-case step: the file's (:meth:`worst_step`) where the trials train on
        fewer samples than the file (:attr:`cut`), None where their own rows are the file's (the trial builds it
        from them)."""
        return self.worst_step(max_seq_length, batch_size, packing) or None if self.cut else None


def file_lengths(
    spec: Any,
    tokenizer: Any,
    horizon: int,
    sampled: Sequence[TokenizedSample],
    samples: Sequence[Sample] | None = None,
) -> FileLengths:
    """The whole file's :class:`FileLengths`, given the trials' samples already tokenized at ``horizon``: when
    ``dataset.max_samples`` left samples out, the file is read again without it and the rest tokenized (each row
    once per command); when ``samples`` (the trials' samples, untokenized) are fewer than ``max_samples``, they are
    the whole file in the trials' order and it is not read again.

    Args:
        spec: The study's :class:`sweeper.space.DatasetSpec`.
        tokenizer: The trials' tokenizer (:func:`sweeper.data.load_tokenizer`).
        horizon: Tokens each row is tokenized up to (:func:`sweeper.data.audit_horizon`).
        sampled: The trials' samples, tokenized at ``horizon`` (:func:`sweeper.data.tokenize_samples`).

    Raises:
        DataError: The file cannot be read again (it changed since the samples were read).
    """
    sampled_longest = max((t.n_tokens for t in sampled), default=0)
    taken_all = samples is not None and len(samples) < spec.max_samples
    whole = samples if taken_all and samples is not None else load_samples(replace(spec, max_samples=WHOLE_FILE))
    known = {t.index: t.n_tokens for t in sampled}
    firsts = {t.index: first_target(t.labels) for t in sampled}
    rest = tokenize_samples([s for s in whole if s.index not in known], tokenizer, horizon)
    known.update((t.index, t.n_tokens) for t in rest)
    firsts.update((t.index, first_target(t.labels)) for t in rest)
    # a row the chat template refuses is in no tokenized list: the trials cannot train it, nor the worst step hold it
    lengths = tuple((s.index, known[s.index]) for s in whole if s.index in known)
    return FileLengths(lengths, len(sampled), sampled_longest, tuple((i, firsts[i]) for i, _ in lengths))


def file_samples(spec: Any, indices: Sequence[int]) -> list[Sample]:
    """The samples of the whole dataset file (``max_samples`` ignored) whose dataset indices are ``indices``, in the
    file's trial order: what a trial reads to build the file's worst step (:meth:`FileLengths.worst_step`) without
    keeping the rest of the file.

    Raises:
        DataError: The file cannot be read.
    """
    wanted = set(indices)
    return [s for s in load_samples(replace(spec, max_samples=WHOLE_FILE)) if s.index in wanted]
