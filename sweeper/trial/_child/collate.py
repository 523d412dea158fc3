"""How a trial batches its rows, as the production stacks the export targets do (child side; imports torch):

- **padding** (``packing`` false, the default): each micro-batch is padded (right) to its longest row, as
  transformers' ``DataCollatorForSeq2Seq`` and TRL's collator do; a row is one sample truncated to
  ``max_seq_length``.
- **packing** (``packing`` true): consecutive samples, in the data's order, are packed into rows of at most
  ``max_seq_length`` tokens (:func:`pack_rows`; a sample that does not fit starts the next row), as TRL's
  ``packing``, axolotl's ``sample_packing`` and LLaMA-Factory's ``neat_packing`` do; the position ids restart at 0
  at each sample and the batch carries no attention mask, so that transformers builds a block-diagonal causal mask
  from them (``masking_utils.find_packed_sequence_indices``, for ``sdpa``, ``eager`` and ``flash_attention_2``
  alike): no token attends to another sample. The first label of each sample is -100 (it would be predicted from
  the sample before it), as in transformers' ``DataCollatorWithFlattening``. A micro-batch of packed rows is padded
  to its longest row; the padding is a segment of its own (positions restarting at 0, labels -100).

Every collated batch carries two bookkeeping tensors besides the model's inputs, which :func:`model_inputs` removes:
``sample_index`` (``[b, k]``, the dataset indices of each row's samples, -1 past the row's last) and
``sample_tokens`` (``[b]``, the tokens of each row that are the data's own, not padding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from sweeper.data import pack_groups

#: Keys of a collated batch that are not the model's inputs.
BOOKKEEPING_KEYS = ("sample_index", "sample_tokens")

Row = dict[str, Any]
Collator = Callable[[list[Row]], dict[str, Any]]


def pack_rows(rows: Sequence[Mapping[str, Any]], max_seq_length: int) -> list[Row]:
    """Pack consecutive tokenized samples into rows of at most ``max_seq_length`` tokens, in order (greedy: a sample
    that does not fit in the current row starts the next one; a sample is never split; the grouping is
    :func:`sweeper.data.pack_groups`, which the commands use to count packed rows before a trial runs).

    Args:
        rows: Tokenized samples, each ``{"input_ids", "labels", "index"}``, already truncated to ``max_seq_length``.
        max_seq_length: Tokens per packed row at most, ``>= 1``.

    Returns:
        Packed rows ``{"input_ids", "labels", "position_ids", "index"}``, ``index`` the list of the samples' dataset
        indices; each sample's first label is -100 and its positions run from 0.

    Raises:
        ValueError: A sample is longer than ``max_seq_length`` (it was not truncated), or has no tokens.
    """
    rows = list(rows)
    for row in rows:
        if len(row["input_ids"]) > max_seq_length:
            n = len(row["input_ids"])
            raise ValueError(f"sample {row['index']} has {n} tokens, more than max_seq_length={max_seq_length}")
        if not len(row["input_ids"]):  # tokenization always adds tokens (a template's, or the end of sequence)
            raise ValueError(f"sample {row['index']} has no tokens: nothing to pack")
    packed: list[Row] = []
    for group in pack_groups([len(row["input_ids"]) for row in rows], max_seq_length):
        current: Row = {"input_ids": [], "labels": [], "position_ids": [], "index": []}
        for row in (rows[i] for i in group):
            ids = list(row["input_ids"])
            current["input_ids"] += ids
            current["labels"] += [-100, *list(row["labels"])[1:]]
            current["position_ids"] += range(len(ids))
            current["index"].append(row["index"])
        packed.append(current)
    return packed


def make_collator(pad_id: int, packing: bool = False) -> Collator:
    """The trial's collator: rows padded (right) to the micro-batch's longest row.

    Args:
        pad_id: The tokenizer's pad token id.
        packing: Rows are packed (:func:`pack_rows`): the batch carries ``position_ids`` (padding restarting at 0)
            and no ``attention_mask``; otherwise rows are single samples with an ``attention_mask``.

    Returns:
        ``collate(rows) -> batch`` with ``input_ids``, ``labels`` (``[b, s]``, ``s`` the longest row), then
        ``attention_mask`` (padding) or ``position_ids`` (packing), and the bookkeeping keys of the module docstring.
    """

    def collate(rows: list[Row]) -> dict[str, Any]:
        b, s = len(rows), max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((b, s), pad_id, dtype=torch.long)
        labels = torch.full((b, s), -100, dtype=torch.long)
        second = torch.zeros((b, s), dtype=torch.long)  # attention_mask, or position_ids
        indices = [row["index"] if packing else [row["index"]] for row in rows]
        sample_index = torch.full((b, max(len(i) for i in indices)), -1, dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.tensor(row["input_ids"])
            labels[i, :n] = torch.tensor(row["labels"])
            if packing:
                second[i, :n] = torch.tensor(row["position_ids"])
                second[i, n:] = torch.arange(s - n)
            else:
                second[i, :n] = 1
            sample_index[i, : len(indices[i])] = torch.tensor(indices[i])
        batch = {"input_ids": input_ids, "labels": labels, "position_ids" if packing else "attention_mask": second}
        batch["sample_index"] = sample_index
        batch["sample_tokens"] = torch.tensor([len(row["input_ids"]) for row in rows], dtype=torch.long)
        return batch

    return collate


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """``batch`` without its bookkeeping keys (:data:`BOOKKEEPING_KEYS`): what the model is called with."""
    return {k: v for k, v in batch.items() if k not in BOOKKEEPING_KEYS}


def sample_indices(batch: Mapping[str, Any]) -> list[int]:
    """The dataset indices of the samples in ``batch``, row by row, in order."""
    return [int(i) for i in batch["sample_index"].flatten().tolist() if i >= 0]


def worst_case_rows(rows: Sequence[Row], batch_size: int) -> list[Row]:
    """The rows of the data's worst step at this batch size: its ``batch_size`` longest rows (tokenized samples
    truncated to ``max_seq_length`` when padding, packed rows when packing), the longest first; padded to the
    longest, they make the largest ``[batch_size, s]`` step a run over these rows can take in any order. Fewer when
    the data has fewer rows.

    Raises:
        ValueError: ``rows`` is empty or ``batch_size < 1``.
    """
    if not rows or batch_size < 1:
        raise ValueError(f"need rows and batch_size >= 1, got {len(rows)} rows and batch_size={batch_size}")
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]["input_ids"]), i))
    return [rows[i] for i in order[:batch_size]]


def segments(batch: Mapping[str, Any], r: int) -> list[tuple[int, int, int]]:
    """The samples of row ``r`` of a collated batch as ``(dataset index, start, end)`` spans of its columns (a
    padded row: one span over its unpadded tokens; a packed row: one per sample, split where its positions restart;
    its trailing padding is none of them)."""
    index = [int(i) for i in batch["sample_index"][r].tolist() if i >= 0]
    if "position_ids" not in batch:
        n = int(batch["attention_mask"][r].sum())
        return [(index[0], 0, n)] if index else []
    positions = batch["position_ids"][r].tolist()
    starts = [j for j, p in enumerate(positions) if p == 0]
    ends = starts[1:] + [len(positions)]
    return [(i, start, end) for i, start, end in zip(index, starts, ends)]
