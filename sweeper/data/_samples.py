"""What a dataset becomes: :class:`Sample` (one training example), :class:`DroppedRow` (a row that gave none, with
its reason), :class:`Samples` and :class:`TokenizedSample`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One training sample.

    Attributes:
        index: Row index in the source dataset (before shuffling), so a sample can be named in reports.
        messages: Chat turns ``[{"role": ..., "content": ...}]`` for chat-like formats, else None.
        text: Raw text for the ``text`` format (all tokens supervised), else None.
        completion: The row is a completion (``prompt_completion``, ``alpaca``): its reply is followed by the
            end-of-sequence token, as TRL's ``SFTTrainer`` appends it, unless the chat template's end of turn already
            is that token.
    """

    index: int
    messages: tuple[Mapping[str, str], ...] | None = None
    text: str | None = None
    completion: bool = False


@dataclass(frozen=True)
class DroppedRow:
    """A dataset row that is not trained on, and why.

    Attributes:
        index: The row's 0-based index in the dataset file.
        reason: Short and the same for rows with the same fault (rows are grouped by it): ``empty text``,
            ``no assistant turn``, ``unknown role 'function_call'``, ``a turn whose content is null``, ``a text row in
            a prompt_completion dataset (...)``, ``the chat template refuses it (...)``.
    """

    index: int
    reason: str


class Samples(list[Sample]):  # a list, so that every caller of load_samples keeps working
    """What :func:`load_samples` returns: the samples in trial order, plus the rows of the file not used.

    Attributes:
        dropped: Every row of the dataset that gave no sample, with its reason, by index (before the shuffle and
            ``max_samples``, which leave the other rows out on purpose).
        rows: Rows in the dataset (``len(dropped)`` of them unusable).
    """

    dropped: list[DroppedRow]
    rows: int

    def __init__(self, samples: Sequence[Sample] = (), dropped: Sequence[DroppedRow] = (), rows: int = 0):
        super().__init__(samples)
        self.dropped = list(dropped)
        self.rows = rows


@dataclass(frozen=True, kw_only=True)
class TokenizedSample:
    """A sample as token ids, not yet padded.

    Attributes:
        index: The sample's row index in the source dataset.
        input_ids: Token ids, ``len <= max_seq_length``.
        labels: Same length; ``-100`` on tokens without loss (prompt, system turn).
        n_tokens: Tokens before truncation (to tell how much ``max_seq_length`` cut); for a row whose text was cut
            before tokenizing (``cut``), the cut text's: a lower bound.
        cut: The row's text ran past what any kept token can reach and was cut before tokenizing
            (:func:`sweeper.data.tokenize_samples`): ``n_tokens`` is at least, not exactly, its length.
    """

    index: int
    input_ids: list[int]
    labels: list[int]
    n_tokens: int
    cut: bool = False


def describe_dropped(dropped: Sequence[DroppedRow], limit: int = 5) -> str:
    """The rows not used, grouped by reason, most frequent first: ``30 rows: no assistant turn (rows 1, 3, 5, 7, 9
    and 25 more); 2 rows: unknown role 'function_call' (rows 4, 8)``."""
    groups: dict[str, list[int]] = {}
    for d in dropped:
        groups.setdefault(d.reason, []).append(d.index)
    parts = []
    for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        indices = sorted(indices)
        shown = ", ".join(str(i) for i in indices[:limit])
        more = f" and {len(indices) - limit} more" if len(indices) > limit else ""
        noun = "row" if len(indices) == 1 else "rows"
        parts.append(f"{len(indices)} {noun}: {reason} ({noun} {shown}{more})")
    return "; ".join(parts)


def dataset_rows(samples: Sequence[Sample]) -> int:
    """Rows in the dataset file that :func:`load_samples` read (those it dropped included); ``len(samples)`` for a
    plain list."""
    return int(getattr(samples, "rows", len(samples)))


def pack_groups(lengths: Sequence[int], max_seq_length: int) -> list[list[int]]:
    """Which samples each packed row holds: consecutive samples, in order, into rows of at most ``max_seq_length``
    tokens (greedy: a sample that does not fit in the current row starts the next one; a sample is never split), as
    the trial packs them (:func:`sweeper.trial._child.collate.pack_rows`, TRL's ``packing``, axolotl's
    ``sample_packing``). ``len(result)`` is the rows a packed trial's batches are drawn from.

    Args:
        lengths: Tokens of each sample after truncation, each in ``[1, max_seq_length]``.
        max_seq_length: Tokens per packed row at most, ``>= 1``.

    Returns:
        Per packed row, the positions in ``lengths`` of its samples.

    Raises:
        ValueError: A length is below 1 or above ``max_seq_length``.
    """
    groups: list[list[int]] = []
    used = max_seq_length + 1  # tokens in the current row; past the limit: no row open
    for position, length in enumerate(lengths):
        if not 1 <= length <= max_seq_length:
            raise ValueError(f"sample at position {position} has {length} tokens, outside [1, {max_seq_length}]")
        if used + length > max_seq_length:
            groups.append([])
            used = 0
        groups[-1].append(position)
        used += length
    return groups
