"""Checks that a loaded trial model is what the trial asked for (child side): every 4-bit layer quantized with the
asked settings, every LoRA target wrapped, and packed samples kept apart by the attention. torch and bitsandbytes are
imported inside, when a check runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeper.space import TrialConfig

#: The largest difference of a packed sample's logits from the same sample's alone, over their scale, that still
#: counts as the same attention (block-diagonal). Measured on the tiny Llama of the tests (tests/trial/
#: test_collation.py), sdpa and eager: 2e-7 (sdpa) and 0 (eager) in float32, 2.4e-3 and 0 in bfloat16 (the masked and
#: the causal kernel path round differently); 0.63 when the attention reaches the previous sample.
BLOCK_DIAGONAL_TOLERANCE = 0.05


class SetupCheckError(Exception):
    """The trial's model or rows are not what the trial asked for: it would measure something else."""


class QuantizationCheckError(SetupCheckError):
    """The loaded model is not quantized, or not adapted, as the trial asked."""


class PackingCheckError(SetupCheckError):
    """A packed row's samples attended to each other: the attention implementation did not apply the block-diagonal
    mask that the packed rows' ``position_ids`` ask for."""


def check_quantization(model: Any, config: TrialConfig) -> int:
    """Check that every 4-bit linear layer has the asked compute dtype, quant type and double quant.

    Returns:
        The number of ``bitsandbytes.nn.Linear4bit`` modules.

    Raises:
        QuantizationCheckError: None was found, or one differs from ``config`` (the first difference is named).
    """
    import bitsandbytes as bnb
    import torch

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    if not layers:
        raise QuantizationCheckError("no bitsandbytes 4-bit linear layer after loading: quantization did not apply")
    want_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
    for name, layer in layers:
        state = getattr(layer.weight, "quant_state", None)
        got = {
            "bnb_4bit_compute_dtype": layer.compute_dtype,
            "bnb_4bit_quant_type": getattr(layer.weight, "quant_type", None),
            "bnb_4bit_use_double_quant": bool(getattr(state, "nested", False)),
        }
        want = {
            "bnb_4bit_compute_dtype": want_dtype,
            "bnb_4bit_quant_type": config.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": config.bnb_4bit_use_double_quant,
        }
        for key in want:
            if got[key] != want[key]:
                raise QuantizationCheckError(f"{name}: {key} is {got[key]}, but the trial asked for {want[key]}")
        if state is None:
            raise QuantizationCheckError(f"{name}: weight has no quant_state: it was not quantized")
    return len(layers)


def check_lora_targets(model: Any, config: TrialConfig) -> int:
    """Check that every name in ``config.target_modules`` got a LoRA adapter, by peft's own record of what it wrapped
    (``PeftModel.targeted_module_names``; a target matches a module whose name is it or ends with ``.<target>``, as
    peft's ``check_target_module_exists`` does).

    Returns:
        The number of modules wrapped.

    Raises:
        QuantizationCheckError: A target wrapped nothing (peft itself raises only when no target matched at all).
    """
    wrapped = list(getattr(model, "targeted_module_names", []))
    unmatched = [t for t in config.target_modules if not any(n == t or n.endswith(f".{t}") for n in wrapped)]
    if unmatched:
        raise QuantizationCheckError(
            f"target_modules {unmatched} matched no module of the model: LoRA would train only on "
            f"{sorted({n.rsplit('.', 1)[-1] for n in wrapped})}"
        )
    return len(wrapped)


def check_block_diagonal(
    model: Any, rows: Sequence[Mapping[str, Any]], collate: Callable[[list], dict]
) -> float | None:
    """Check that packing trains each sample as it would alone: one forward of a packed row's first two samples and
    one of the second alone (no gradients, dropout off, the model's mode restored), compared on the second sample's
    logits. Once per packed trial, before training: two short forwards.

    Args:
        model: The adapted model, as training calls it.
        rows: The packed rows (:func:`sweeper.trial._child.collate.pack_rows`).
        collate: The trial's collator (:func:`sweeper.trial._child.collate.make_collator` with packing).

    Returns:
        The largest absolute difference of the second sample's logits over their largest absolute value (a ratio;
        rounding only when the attention is block-diagonal); None when no row holds two samples.

    Raises:
        PackingCheckError: The difference is above :data:`BLOCK_DIAGONAL_TOLERANCE`, naming it and the attention
            implementation.
    """
    import torch

    from sweeper.trial._child.collate import model_inputs

    row = next((r for r in rows if len(r["index"]) >= 2), None)
    if row is None:
        return None
    starts = [j for j, p in enumerate(row["position_ids"]) if p == 0]
    start, end = starts[1], starts[2] if len(starts) > 2 else len(row["position_ids"])
    pair = {k: list(row[k][:end]) for k in ("input_ids", "labels", "position_ids")} | {"index": list(row["index"][:2])}
    alone = {
        "input_ids": list(row["input_ids"][start:end]),
        "labels": [-100, *list(row["labels"][start + 1 : end])],
        "position_ids": list(range(end - start)),
        "index": [row["index"][1]],
    }
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            # no cache, as training runs: with one, transformers does not read packed rows' position_ids as a mask
            packed = model(**model_inputs(collate([pair])), use_cache=False).logits[0, start:end].float()
            single = model(**model_inputs(collate([alone])), use_cache=False).logits[0].float()
    finally:
        model.train(training)
    ratio = float((packed - single).abs().max() / single.abs().max().clamp_min(1e-12))
    if not ratio <= BLOCK_DIAGONAL_TOLERANCE:
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise PackingCheckError(
            f"a packed sample's logits differ from the same sample's alone by {ratio:.3g} of their scale (over "
            f"{BLOCK_DIAGONAL_TOLERANCE:g}): the attention ({implementation}) did not keep packed samples apart "
            "(the block-diagonal mask their position_ids ask for), so the trial would train each sample on the ones "
            "before it; train with packing: false, or another attn_implementation"
        )
    return ratio
