"""The warm state of a trial process (child side): what it keeps between the trials it serves (:class:`WarmState`:
the 4-bit base model, tokenizers, the last dataset, the memory baseline), when two trials may share the base model
(:func:`model_key`), how the kept model is taken for the next trial (:func:`take_model`) and how a trial's additions
are taken off it afterwards (:func:`restore_base`: hooks, LoRA layers, checkpointing; the adapter and optimizer go
with the trainer), and :func:`release_memory`, which hands what a finished trial freed back to the system.
torch and bitsandbytes are imported inside, when a trial runs."""

from __future__ import annotations

import ctypes
import gc
import sys
from dataclasses import dataclass, field
from typing import Any

from sweeper.checkpoint import checkpoint_dtype
from sweeper.space import TrialConfig
from sweeper.trial._child.memory import process_memory_gib, set_cpu_memory_cap

#: Compute dtypes a checkpoint of each dtype casts into without changing a value: loading in any of them gives the
#: same weights, so the same 4-bit weights (measured: fp16 and fp32 loads of the built-in fp16 checkpoint quantize to
#: identical bytes and absmax) and, after peft's float32 upcast, the same float32 norms and embeddings.
_EXACT_CASTS = {
    "float16": ("float16", "float32"),
    "bfloat16": ("bfloat16", "float32"),
    "float32": ("float32",),
}


def model_key(config: TrialConfig, model_path: str) -> tuple[Any, ...]:
    """What decides the loaded 4-bit base model: two trials with the same key can share it.

    The model, its attention implementation and remote-code setting, ``bnb_4bit_quant_type``,
    ``bnb_4bit_use_double_quant``, ``expandable_segments`` (a model kept in segments of the other kind would
    measure the other allocator), and the dtype the weights are loaded in (the compute dtype: a cold trial loads in
    it) unless the checkpoint's own dtype casts exactly into it (:data:`_EXACT_CASTS`): then every such compute dtype
    loads the same weights, and the compute dtype is switched in place on the ``Linear4bit`` layers."""
    stored = checkpoint_dtype(model_path)
    load: str = config.bnb_4bit_compute_dtype
    if stored in _EXACT_CASTS and load in _EXACT_CASTS[stored]:
        load = f"exact from {stored}"
    return (
        model_path,
        config.model.attn_implementation,
        config.model.trust_remote_code,
        config.bnb_4bit_quant_type,
        config.bnb_4bit_use_double_quant,
        config.expandable_segments,
        load,
    )


def release_memory() -> None:
    """Collect garbage and return freed heap to the system (glibc ``malloc_trim``), and empty CUDA's cache: what a
    finished trial freed must not count in the next trial's peak or cap.

    Also forgets bitsandbytes' ``GlobalOptimManager`` overrides: for an 8-bit optimizer ``Trainer`` registers every
    ``nn.Embedding`` there (``optim_bits=32``), and that process-wide singleton would keep the last trial's embedding
    alive (measured on the built-in model: 0.105 GiB of its fp32 embedding after its model was dropped).
    """
    bnb = sys.modules.get("bitsandbytes")
    if bnb is not None:
        bnb.optim.GlobalOptimManager.get_instance().initialize()
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class WarmState:
    """What a trial process keeps between the trials it serves.

    Attributes:
        trials: Trials this process finished before the current one (0: a cold trial).
        base_gap_gib: The data segment's non-resident part before this process's first trial (GiB).
        cap_gib: The running trial's ``memory_limit_gib`` on the CPU, else None.
        model: The 4-bit base model of the last trial, restored (no adapter, no hooks, no checkpointing), or None.
        model_key: Its :func:`model_key`.
        tokenizers: Loaded tokenizers by (model path, trust_remote_code).
        samples: The last dataset read, as (key, samples).
        reusable: Whether this process may take another trial (set by :func:`sweeper.trial._child.worker.run`).
    """

    trials: int = 0
    model: Any = None
    model_key: tuple[Any, ...] | None = None
    tokenizers: dict[tuple[str, bool], Any] = field(default_factory=dict)
    samples: tuple[str, Any] | None = None
    reusable: bool = True
    base_gap_gib: float | None = None
    cap_gib: float | None = None

    def drop_model(self) -> None:
        """Forget the kept model and hand its memory back to the system (so it counts in no later trial's peak)."""
        self.model, self.model_key = None, None
        release_memory()
        if self.cap_gib is not None:
            self.set_cpu_cap(self.cap_gib)

    def set_cpu_cap(self, limit_gib: float) -> float:
        """Cap this trial's memory at ``limit_gib`` as a fresh process would be capped (``RLIMIT_DATA``), and return
        the allowance added for what earlier trials left mapped.

        ``RLIMIT_DATA`` counts the data segment, resident or not: heap that an earlier trial freed stays mapped in
        glibc's arenas, and ``malloc_trim`` makes it non-resident (so it counts in no peak) without unmapping it. The
        allowance is how much the data segment's non-resident part (``VmData - VmRSS``) grew since this process's
        first trial began (``base_gap_gib``): free room the trial reuses before it maps anything new, which a fresh
        process would not hold (measured on the built-in model: a warm process held a 0.94 GiB data segment at a
        trial's start, 0.71 GiB resident, against 0.43 and 0.46 before its first trial; without the allowance a
        configuration that fits ran out of memory while loading)."""
        self.cap_gib = limit_gib
        held = process_memory_gib()
        if "VmData" not in held or "VmRSS" not in held or self.base_gap_gib is None:
            set_cpu_memory_cap(limit_gib)
            return 0.0
        allowance = max(0.0, (held["VmData"] - held["VmRSS"]) - self.base_gap_gib)
        set_cpu_memory_cap(limit_gib + allowance)
        return allowance

    def take_model(self, config: TrialConfig, key: tuple[Any, ...]) -> Any | None:
        """The kept base model for a trial whose :func:`model_key` is ``key``, its compute dtype switched in place to
        ``config``'s, and no longer kept here; None (after the kept one was dropped, so two never coexist) when the
        keys differ or nothing is kept."""
        import bitsandbytes as bnb
        import torch

        if self.model is None or self.model_key != key:
            self.drop_model()
            return None
        model, self.model, self.model_key = self.model, None, None
        compute_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
        for module in model.modules():
            if isinstance(module, bnb.nn.Linear4bit):
                module.compute_dtype = compute_dtype
                module.compute_type_is_set = True
                # The dtype the 4-bit weight dequantizes to: a cold load records the dtype it quantized from, the
                # compute dtype (with another one, bf16 -> fp32 the trace differed from step 1 on: measured).
                module.weight.quant_state.dtype = compute_dtype  # type: ignore[attr-defined]
        model.config.dtype = compute_dtype
        return model


def restore_base(peft_model: Any, hooks: list[Any]) -> Any | None:
    """The base model with everything the trial added taken off: the activation hooks, the LoRA layers (peft
    ``unload``, no merge), gradient checkpointing and the input-grad hook of ``prepare_model_for_kbit_training``.
    None when a base weight is no longer finite (the next trial must load afresh)."""
    import torch

    for handle in hooks:
        handle.remove()
    base = peft_model.unload()
    if hasattr(base, "peft_config"):
        del base.peft_config
    # transformers 5.23 renamed gradient checkpointing to activation checkpointing (the old names warn there).
    if hasattr(base, "is_activation_checkpointing"):
        if base.is_activation_checkpointing:
            base.activation_checkpointing_disable()
    elif getattr(base, "is_gradient_checkpointing", False):
        base.gradient_checkpointing_disable()
    if getattr(base, "_require_grads_hook", None) is not None:
        base.disable_input_require_grads()
    for param in base.parameters():
        param.grad = None
        if param.is_floating_point() and not bool(torch.isfinite(param).all()):
            return None
    return base
