"""Checks that a loaded trial model is what the trial asked for (child side): every 4-bit layer quantized with the
asked settings, and every LoRA target wrapped. torch and bitsandbytes are imported inside, when a check runs."""

from __future__ import annotations

from typing import Any

from sweeper.space import TrialConfig


class QuantizationCheckError(Exception):
    """The loaded model is not quantized, or not adapted, as the trial asked."""


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
