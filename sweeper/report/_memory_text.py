"""Memory as text: predicted against measured peaks, the ``max_seq_length`` values that train the same rows, and
the cap with the device it is of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sweeper.report._analysis_records import MemoryPrediction
from sweeper.space import same_rows_lengths

if TYPE_CHECKING:
    from sweeper.data import FileLengths


def format_memory_prediction(prediction: MemoryPrediction) -> str | None:
    """One line of ``sweep report``: the preflight's median error before and after its correction
    (:func:`sweeper.report._data.memory_prediction_data`); None without a complete trial that had a prediction."""
    if prediction.median_error is None:
        return None
    n = sum(1 for r in prediction.trials if r.error is not None)
    line = (
        f"memory  predicted vs measured peak: median error {100 * prediction.median_error:.0f}% over {n} "
        f"trial{'s' if n != 1 else ''}"
    )
    if prediction.median_corrected_error is not None:
        corrected = prediction.corrected_trials
        line += (
            f", {100 * prediction.median_corrected_error:.0f}% after the study's correction "
            f"({corrected} trial{'s' if corrected != 1 else ''} predicted with it)"
        )
    return line


def format_same_rows(
    max_seq_lengths: Sequence[int], longest_sample_tokens: int | None, packing: bool | Sequence[bool]
) -> str | None:
    """One line naming the ``max_seq_length`` values that train the same rows on this data: every value at or above
    its longest tokenized sample truncates nothing, and padding each micro-batch to its longest row gives the same
    steps at each (``max_seq_length 2048 and 4096 train the same rows on this data (longest 1,320 tokens)``). None
    when fewer than two values do, the longest is unknown, or every trial packs (a packed row fills up to
    ``max_seq_length``: each value trains other rows).

    Args:
        packing: Whether the trials pack their rows: one bool for all, or the values the space takes (``[False,
            True]`` when packing is searched: the line is then said of the padded trials).
    """
    packs = [packing] if isinstance(packing, bool) else list(packing)
    if longest_sample_tokens is None or all(packs):
        return None
    same = same_rows_lengths(max_seq_lengths, longest_sample_tokens)
    if not same:
        return None
    values = ", ".join(map(str, same[:-1])) + f" and {same[-1]}"
    which = "the padded trials' " if any(packs) else ""
    return (
        f"{which}max_seq_length {values} train the same rows on this data (longest {longest_sample_tokens:,} tokens): "
        f"a sweep measures one and settles the others as its repeats"
    )


def format_file_rows(file: FileLengths) -> str | None:
    """One line saying that the worst step is the whole file's when ``dataset.max_samples`` sampled fewer rows than
    it holds and its longest sample is longer than theirs (``the worst step is the whole file's, which the exports
    train: its longest sample 1,320 tokens (row 280), the trials' 16 sampled rows' longest 609``); None otherwise."""
    if not file.cut or file.longest <= file.sampled_longest:
        return None
    spans = dict(file.repeated_spans)
    first = f": one unit repeated over {spans[file.longest_row]:,} tokens" if file.longest_row in spans else ""
    others = "".join(
        f"; row {row} repeats one unit over {span:,} tokens" for row, span in file.repeated_spans[:3]
        if row != file.longest_row
    )  # fmt: skip
    return (
        f"the worst step is the whole file's, which the exports train: its longest sample {file.longest:,} tokens "
        f"(row {file.longest_row}{first}{others}), "
        f"the trials' {file.sampled} sampled rows' (dataset.max_samples) longest {file.sampled_longest:,}; each "
        "trial runs the file's longest rows as its worst-case step"
    )


def format_cap(
    limit_gib: float, auto: bool, card_name: str | None, card_gib: float | None, device: str, *, given: bool = False
) -> str:
    """The cap with the device it is of: ``cap 23.15 GiB (auto) of the card's 23.65 GiB (NVIDIA GeForce RTX
    4090)``, ``cap 1.6 GiB of this machine's 23.54 GiB``, ``cap 22 GiB of the 80.00 GiB given by --card-gib``, or
    ``cap 22 GiB`` when the device was not read; ``given``: a card given, not read (``--card-gib``)."""
    text = f"cap {limit_gib:g} GiB" + (" (auto)" if auto else "")
    if card_gib is None:
        return text
    if device == "cpu" and given:  # not this machine: estimate's --card-gib
        return f"{text} of the {card_gib:.2f} GiB {card_name}"
    if device == "cpu":
        return f"{text} of this machine's {card_gib:.2f} GiB"
    return f"{text} of the card's {card_gib:.2f} GiB ({card_name})"
