"""Replaying one row of a step that went NaN: as it was trained, or with the 4-bit layers computing in float32, and
the first module whose output was not finite (forward hooks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class NanRow:
    """One row of the failing step, as written to ``nan_batch.jsonl``.

    Attributes:
        index: Dataset row index (``Sample.index``).
        micro_batch: 0-based micro-batch of the step it was in (``gradient_accumulation_steps`` > 1).
        input_ids: The row's tokens as trained (padding removed), ``len <= max_seq_length``.
        labels: Same length; -100 where no loss is computed.
        padded_ids, attention_mask, padded_labels: The row exactly as the collator built it (padding included; a
            packed sample: the sample alone), for the replay; not written to ``nan_batch.jsonl``.
        supervised_tokens: ``labels[1:] != -100`` (the causal shift drops position 0).
        invalid_token_ids: Ids outside ``[0, vocab_size)``, sorted, unique.
        nonfinite_inputs: A float input of the row holds NaN or inf.
        fp32_loss: The row's loss in the fp32 replay (None: not replayed, or non-finite).
        fp32_finite: Whether the fp32 replay (loss, and gradient when replayed) was finite; None: not replayed.
        at_fault: The row itself caused the NaN (``data`` only); then it is named in ``nan_samples``.
    """

    index: int
    micro_batch: int
    input_ids: list[int]
    labels: list[int]
    supervised_tokens: int
    invalid_token_ids: list[int] = field(default_factory=list)
    nonfinite_inputs: bool = False
    fp32_loss: float | None = None
    fp32_finite: bool | None = None
    at_fault: bool = False
    padded_ids: list[int] = field(default_factory=list)
    attention_mask: list[int] = field(default_factory=list)
    padded_labels: list[int] = field(default_factory=list)

    @property
    def padding(self) -> int:
        """Positions of the row the attention mask hides (the collator's padding)."""
        return sum(1 for m in self.attention_mask if not m)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, ``input_ids`` and ``labels`` replaced by ``tokens_trained`` (the artifact carries the decoded
        text instead)."""
        out = asdict(self)
        for key in ("labels", "padded_ids", "attention_mask", "padded_labels"):
            out.pop(key)
        return {"index": out.pop("index"), "tokens_trained": len(out.pop("input_ids")), **out}


@contextlib.contextmanager
def _fp32_compute(model: Any) -> Iterator[None]:
    """Every ``bitsandbytes.nn.Linear4bit`` computes in float32 and autocast is off; restored on exit."""
    import bitsandbytes as bnb
    import torch

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    saved = [m.compute_dtype for m in layers]
    device_type = next(model.parameters()).device.type
    for m in layers:
        m.compute_dtype = torch.float32
    try:
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    finally:
        for m, dtype in zip(layers, saved):
            m.compute_dtype = dtype


def replay_row(model: Any, row: NanRow, *, with_gradient: bool, padded: bool = True) -> tuple[float, bool]:
    """Run one row alone through ``model`` in the current precision context (train mode, weights untouched).

    Args:
        model: The peft model of the trial.
        row: As trained: its padded tokens, attention mask and labels form a ``[1, max_seq_length]`` batch; without
            ``padded`` (or when the row carries no padded form), its tokens alone, ``[1, len(row.input_ids)]``.
        with_gradient: Also compute the gradient of the trainable parameters (``torch.autograd.grad``: the
            parameters' ``.grad`` is left alone) and require its norm to be finite.
        padded: Replay with the padding (the default), or without it.

    Returns:
        ``(loss, finite)``: the row's mean loss over its supervised tokens, and whether loss (and gradient) were
        finite.
    """
    import torch

    device = next(model.parameters()).device
    if padded and row.padded_ids:
        ids = torch.tensor([row.padded_ids], device=device)
        labels = torch.tensor([row.padded_labels], device=device)
        mask = torch.tensor([row.attention_mask], device=device)
    else:
        ids = torch.tensor([row.input_ids], device=device)
        labels = torch.tensor([row.labels], device=device)
        mask = torch.ones_like(ids)
    kwargs = {"input_ids": ids, "attention_mask": mask, "labels": labels, "use_cache": False}
    if not with_gradient:
        with torch.no_grad():
            loss = model(**kwargs).loss
        return float(loss), bool(torch.isfinite(loss))
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.enable_grad():
        loss = model(**kwargs).loss
        if not torch.isfinite(loss):
            return float(loss), False
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    norm = torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads if g is not None]))
    return float(loss), bool(torch.isfinite(norm))


def first_nonfinite_module(model: Any, batches: Sequence[Mapping[str, Any]], precision: Any) -> str | None:
    """The first module (in execution order) whose output holds NaN or inf when the step's micro-batches run again
    forward in the trial's precision.

    Args:
        model: The peft model.
        batches: The step's collated micro-batches (their bookkeeping keys are not passed to the model).
        precision: A context manager factory giving the training's autocast (``Trainer.compute_loss_context_manager``).

    Returns:
        The module's name without peft's ``base_model.model.`` prefix, or None when every output was finite.
    """
    import torch

    from sweeper.trial._child.collate import model_inputs

    found: list[str] = []

    def nonfinite(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return value.is_floating_point() and not bool(torch.isfinite(value).all())
        if isinstance(value, Mapping):
            return any(nonfinite(v) for v in value.values())
        if isinstance(value, (tuple, list)):
            return any(nonfinite(v) for v in value)
        return False

    def hook(name: str):
        def fn(_module, _inputs, output):
            if not found and nonfinite(output):
                found.append(name)

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                with precision():
                    model(**{k: v.to(device) for k, v in model_inputs(batch).items()}, use_cache=False)
                if found:
                    break
    finally:
        for h in handles:
            h.remove()
    return found[0].removeprefix("base_model.model.") if found else None
