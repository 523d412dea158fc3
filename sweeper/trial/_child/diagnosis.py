"""Why a trial went NaN: ``data``, ``precision`` or ``optimization``, decided on the failing step itself.

Child side (imports torch; called by :mod:`sweeper.trial._child.recipe` at the first non-finite loss or gradient norm,
before the optimizer has applied that step, so the weights are the ones that failed). The decision, in order:

1. **Static checks of the step's rows** (no compute): an input id outside the embedding, a non-finite value in a
   float input, or no supervised token in the whole step (cross-entropy averaged over zero tokens is 0/0). Any of
   them: ``data``, naming the rows.
2. **The embedding rows of the step's tokens, padding included**: a token whose input-embedding row is NaN or
   infinite in the trial's weights (a value beyond float16's range becomes inf when the model loads in float16)
   makes every row that holds it non-finite, even as padding: a masked position still enters attention with weight
   0, and 0 x NaN is NaN (the pad-token case of unsloth#4104). ``data``, naming the token, its id and the rows it is
   in or pads.
3. **fp32 replay, row by row, as trained**: every row with a supervised token runs again alone on the same weights,
   with its padding and attention mask, the 4-bit layers computing in float32 and autocast off (and its backward,
   when the gradient norm was the non-finite value). All finite: the compute dtype overflowed, ``precision``; the
   first module whose output is non-finite in a replay in the original compute dtype is named. A row non-finite with
   its padding and finite without it: ``data``, the padding.
4. **Rows still non-finite in fp32**: ``optimization`` when the weights fail on clean rows too (up to
   :data:`CONTROL_ROWS` rows of the last finite step, replayed the same way) or the gradient norm grew by
   :data:`GRAD_NORM_GROWTH` or more over the run (learning_rate times lora_alpha/r too large); otherwise those rows
   are non-finite on their own on weights that handle other rows: ``data``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sweeper.space import TrialConfig
from sweeper.trial._child.record import TrainingRecord
from sweeper.trial._child.replay import NanRow, _fp32_compute, first_nonfinite_module, replay_row
from sweeper.trial._child.special_tokens import bad_embedding_rows, token_name

NanCause = Literal["data", "precision", "optimization"]


#: A NaN that persists in fp32 on statically clean data is blamed on optimization when the largest finite gradient
#: norm of the run is at least this many times the first step's (a short healthy run stays within about 3x; the
#: diverging runs of tests/trial/test_diagnosis.py grow by 1e3x or more before their NaN).
GRAD_NORM_GROWTH = 10.0


#: Rows of the last finite step replayed as controls: if they fail too, the weights are at fault, not the rows.
CONTROL_ROWS = 2


@dataclass(kw_only=True)
class NanDiagnosis:
    """The cause of a trial's first non-finite value.

    Attributes:
        cause: ``data``, ``precision``, ``optimization``, or None when the replay could not run.
        samples: Dataset indices: the rows at fault for ``data``; for the other causes every row of the failing step
            (the rows are not at fault, the step is where it happened).
        reason: One line, starting with the cause.
        module: For ``precision``: the first module whose output was non-finite in the compute dtype (peft's
            ``base_model.model.`` prefix removed); None when the forward was finite (overflow in the backward pass).
        rows: Every row of the failing step.
    """

    cause: NanCause | None
    samples: list[int]
    reason: str
    module: str | None = None
    rows: list[NanRow] = field(default_factory=list)


def _data_fault(rows: list[NanRow], faulty: Sequence[NanRow], reason: str) -> NanDiagnosis:
    """``data``: mark ``faulty`` (rows of ``rows``) at fault and blame them, with ``reason``."""
    for r in faulty:
        r.at_fault = True
    return NanDiagnosis(cause="data", samples=[r.index for r in faulty], rows=rows, reason=reason)


def step_rows(batches: Sequence[Mapping[str, Any]], vocab_size: int) -> list[NanRow]:
    """The samples of a step's micro-batches (as the collator built them, on any device), one :class:`NanRow` each,
    padding removed: a padded row is one sample; a packed row holds several, each replayed alone (its positions
    restart at 0 and it attends to no other sample, so alone it computes what it computed packed).

    Args:
        batches: Collated micro-batches (:func:`sweeper.trial._child.collate.make_collator`): ``input_ids``,
            ``labels`` (``[b, s]`` tensors), ``attention_mask`` or ``position_ids``, ``sample_index``; other float
            tensors are checked for non-finite values.
        vocab_size: Rows of the model's input embedding.
    """
    import torch

    from sweeper.trial._child.collate import segments

    rows = []
    for mb, batch in enumerate(batches):
        floats = [v for v in batch.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        for r in range(batch["input_ids"].shape[0]):
            full_ids = batch["input_ids"][r].tolist()
            full_labels = batch["labels"][r].tolist()
            packed = "position_ids" in batch
            for index, start, end in segments(batch, r):
                ids, labels = full_ids[start:end], full_labels[start:end]
                rows.append(
                    NanRow(
                        index=int(index),
                        micro_batch=mb,
                        input_ids=ids,
                        labels=labels,
                        supervised_tokens=sum(1 for t in labels[1:] if t != -100),
                        invalid_token_ids=sorted({i for i in ids if i < 0 or i >= vocab_size}),
                        nonfinite_inputs=any(not bool(torch.isfinite(f[r]).all()) for f in floats),
                        padded_ids=ids if packed else full_ids,
                        attention_mask=[1] * len(ids) if packed else batch["attention_mask"][r].tolist(),
                        padded_labels=labels if packed else full_labels,
                    )
                )
    return rows


def _growth(grad_norm_trace: Sequence[float | None]) -> float:
    """Largest finite gradient norm over the first one (1.0 with fewer than two)."""
    finite = [g for g in grad_norm_trace if g is not None and math.isfinite(g) and g > 0]
    return max(finite) / finite[0] if len(finite) >= 2 else 1.0


def _names(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:6])
    more = f" and {len(indices) - 6} more" if len(indices) > 6 else ""
    return ("sample " if len(indices) == 1 else "samples ") + shown + more


def _bad_token_diagnosis(
    rows: list[NanRow], bad: Mapping[int, str], compute_dtype: str, tokenizer: Any, model: Any
) -> NanDiagnosis:
    """``data``: the rows holding or padded with a token whose embedding row is bad (see :func:`bad_embedding_rows`)."""
    token = min(bad, key=lambda t: (bad[t] not in ("nan", "inf"), t))
    holders = [r for r in rows if token in r.input_ids]
    padded = [r for r in rows if r not in holders and token in r.padded_ids]
    what = bad[token]
    row_kind = f"a non-finite ({what}) embedding row" if what in ("nan", "inf") else f"an embedding row {what}"
    if what == "inf" and compute_dtype == "float16":
        row_kind += " (a value beyond float16's 65504 becomes inf when the model loads in float16)"
    where = []
    if padded:
        where.append(
            f"it pads {_names([r.index for r in padded])}, and a masked position still enters attention with weight "
            "0 (0 x NaN = NaN)"
        )
    if holders:
        where.append(f"{_names([r.index for r in holders])} hold{'s' if len(holders) == 1 else ''} it")
    others = len(bad) - 1
    return _data_fault(
        rows,
        holders + padded,
        f"data: {token_name(token, tokenizer, model)} has {row_kind}; {'; '.join(where)}"
        + (f" ({others} other token{'s' if others > 1 else ''} of the step too)" if others else "")
        + "; fix that row of the checkpoint's embedding, or pad with another token",
    )


@dataclass
class _Replay:
    """What the fp32 replay found: the rows replayed, those still non-finite, those non-finite only with their
    padding, whether each control row stayed finite, and the module that overflowed in the compute dtype."""

    replayed: list[NanRow]
    bad: list[NanRow]
    padding_only: list[NanRow]
    controls: list[NanRow]
    controls_finite: list[bool]
    module: str | None


def _static_fault(rows: list[NanRow], vocab_size: int, max_seq_length: int) -> NanDiagnosis | None:
    """``data`` when a row holds an id outside the embedding or a non-finite input, or the step has no supervised
    token (rule 1); None when the rows are statically clean."""
    invalid = [r for r in rows if r.invalid_token_ids]
    if invalid:
        worst = max(i for r in invalid for i in r.invalid_token_ids)
        return _data_fault(
            rows,
            invalid,
            f"data: {_names([r.index for r in invalid])} hold token id {worst}, outside the model's {vocab_size} "
            "embedding rows (a tokenizer token the model was not resized for); on CUDA a device-side assert",
        )
    dirty = [r for r in rows if r.nonfinite_inputs]
    if dirty:
        return _data_fault(rows, dirty, f"data: {_names([r.index for r in dirty])} hold NaN or inf in their inputs")
    if sum(r.supervised_tokens for r in rows) == 0:
        return _data_fault(
            rows,
            rows,
            f"data: no supervised token in the step ({_names([r.index for r in rows])}): "
            f"max_seq_length={max_seq_length} cuts the reply away, and the loss averages over zero tokens",
        )
    return None


def _replay(
    model: Any,
    rows: list[NanRow],
    record: TrainingRecord,
    vocab_size: int,
    *,
    with_gradient: bool,
    compute_dtype: str,
    precision: Any,
) -> _Replay:
    """Replay the step's rows alone in fp32 (and without their padding when they fail), then up to
    :data:`CONTROL_ROWS` rows of the last finite step when some fail, then name the overflowing module when none
    does (rules 3 and 4). Raises what the replay raises (out of memory under the trial's cap, among others)."""
    replayed = [r for r in rows if r.supervised_tokens > 0]
    with _fp32_compute(model):
        for r in replayed:
            loss, r.fp32_finite = replay_row(model, r, with_gradient=with_gradient)
            r.fp32_loss = loss if math.isfinite(loss) else None
        bad = [r for r in replayed if not r.fp32_finite]
        padding_only = [
            r for r in bad if r.padding and replay_row(model, r, with_gradient=with_gradient, padded=False)[1]
        ]
        controls = (
            []
            if not bad
            else [r for r in step_rows(record.last_batches, vocab_size) if r.supervised_tokens > 0][:CONTROL_ROWS]
        )
        controls_finite = [replay_row(model, c, with_gradient=with_gradient)[1] for c in controls]
    module = None
    if not bad and compute_dtype != "float32":
        module = first_nonfinite_module(model, record.step_batches, precision)
    return _Replay(replayed, bad, padding_only, controls, controls_finite, module)


def _padding_fault(rows: list[NanRow], padding_only: list[NanRow], tokenizer: Any, model: Any) -> NanDiagnosis:
    """``data``: rows non-finite with their padding and finite without it."""
    pads = sorted({r.padded_ids[j] for r in padding_only for j, m in enumerate(r.attention_mask) if not m})
    names = ", ".join(token_name(t, tokenizer, model) for t in pads)
    one = len(padding_only) == 1
    return _data_fault(
        rows,
        padding_only,
        f"data: {_names([r.index for r in padding_only])} {'is' if one else 'are'} "
        f"non-finite in an fp32 replay with {'its' if one else 'their'} padding "
        f"({names}) and finite without it: the padding token breaks the step",
    )


def _all_finite(rows: list[NanRow], module: str | None, compute_dtype: str) -> NanDiagnosis:
    """Every row finite in fp32: ``precision`` (the compute dtype overflowed), or unknown in float32."""
    everyone = [r.index for r in rows]
    if compute_dtype == "float32":
        return NanDiagnosis(
            cause=None,
            samples=everyone,
            rows=rows,
            reason="cause unknown: every row is finite when replayed alone in float32 (the failure did not reproduce)",
        )
    where = f"in {module}" if module else "in the backward pass (the forward was finite)"
    return NanDiagnosis(
        cause="precision",
        samples=everyone,
        rows=rows,
        module=module,
        reason=(
            f"precision: {compute_dtype} overflowed {where}; an fp32 replay of the same step on the same weights "
            "is finite"
        ),
    )


def _still_nonfinite(rows: list[NanRow], found: _Replay, config: TrialConfig, record: TrainingRecord) -> NanDiagnosis:
    """Rows non-finite in fp32 too: ``optimization`` when the controls fail or the gradient norm grew by
    :data:`GRAD_NORM_GROWTH`, else ``data``, the rows (rule 4)."""
    growth = _growth(record.grad_norm)
    if any(not ok for ok in found.controls_finite) or growth >= GRAD_NORM_GROWTH:
        why = (
            f"the gradient norm grew {growth:.3g}x over {len(record.grad_norm)} steps"
            if growth >= GRAD_NORM_GROWTH
            else "rows of the last finite step fail too on these weights"
        )
        return NanDiagnosis(
            cause="optimization",
            samples=[r.index for r in rows],
            rows=rows,
            reason=(
                f"optimization: still non-finite in fp32 on clean data, and {why} (learning_rate "
                f"{config.learning_rate:g} x lora_alpha/r {config.lora_alpha_ratio:g} too large)"
            ),
        )
    faulty = [r.index for r in found.bad]
    if found.controls:
        context = "on weights that are finite for the last finite step's rows"
    elif len(found.bad) < len(found.replayed):
        context = "on weights that are finite for the step's other rows"
    else:
        context = "at the first step, before any update of the adapter"
    return _data_fault(
        rows, found.bad, f"data: {_names(faulty)} stay non-finite on their own in an fp32 replay, {context}"
    )


def diagnose_nan(
    model: Any,
    config: TrialConfig,
    record: TrainingRecord,
    *,
    failed_in: Literal["loss", "gradient norm", "input id"],
    precision: Any = contextlib.nullcontext,
    tokenizer: Any = None,
) -> NanDiagnosis:
    """Decide why the step went non-finite (see the module docstring for the rules).

    Args:
        model: The trial's peft model, with the weights the step failed on; its input embedding's rows are the
            vocabulary size.
        config: The trial: ``bnb_4bit_compute_dtype``, and for the reasons ``learning_rate``, ``lora_alpha_ratio``
            (an ``optimization`` NaN) and ``max_seq_length`` (a step without supervised tokens).
        record: What training recorded: ``step_batches`` (the failing step's micro-batches, as given to
            ``Trainer.training_step`` plus ``sample_index``), ``last_batches`` (the last finite step's, [] at step 1)
            and ``grad_norm`` (pre-clip gradient norms of the finished steps).
        failed_in: What was non-finite first; ``gradient norm`` makes the replay include the backward pass.
        precision: Context manager factory of the training's autocast, for naming the overflowing module.
        tokenizer: The trial's tokenizer, to name a token by its text (without it, by its id and special role).

    Returns:
        The diagnosis. A replay that itself fails (out of memory under the trial's cap) gives ``cause=None`` and says
        so in the reason; nothing is raised.
    """
    compute_dtype = config.bnb_4bit_compute_dtype
    vocab_size = model.get_input_embeddings().num_embeddings
    rows = step_rows(record.step_batches, vocab_size)
    static = _static_fault(rows, vocab_size, config.max_seq_length)
    if static is not None:
        return static
    try:
        bad_tokens = bad_embedding_rows(model, [i for r in rows for i in r.padded_ids or r.input_ids], compute_dtype)
    except Exception:  # a model without an input embedding to read: the replay decides
        bad_tokens = {}
    if bad_tokens:
        return _bad_token_diagnosis(rows, bad_tokens, compute_dtype, tokenizer, model)
    try:
        found = _replay(
            model,
            rows,
            record,
            vocab_size,
            with_gradient=failed_in == "gradient norm",
            compute_dtype=compute_dtype,
            precision=precision,
        )
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        return NanDiagnosis(
            cause=None,
            samples=[r.index for r in rows],
            rows=rows,
            reason=f"cause unknown: the fp32 replay failed ({type(exc).__name__}: {first})",
        )
    if found.padding_only:
        return _padding_fault(rows, found.padding_only, tokenizer, model)
    if not found.bad:
        return _all_finite(rows, found.module, compute_dtype)
    return _still_nonfinite(rows, found, config, record)
