"""Predicted peak GPU memory of one QLoRA configuration, from the model's ``config.json`` and the trial's settings,
without loading weights (``sweep estimate``, and the sweep's preflight).

Pure: no torch. Every term is in bytes here and in GiB in :class:`MemoryEstimate`; each has its formula and source
in its function's docstring, and ``tests/memory/test_estimate.py`` checks each against bytes actually held by a real
model (quantized storage, parameters, optimizer state after a real step, tensors saved for backward counted with
``torch.autograd.graph.saved_tensors_hooks``). Notation: ``T = per_device_train_batch_size * max_seq_length``
tokens per micro-batch, ``h`` hidden size, ``i`` intermediate size, ``L`` layers, ``V`` vocabulary, ``r`` LoRA rank,
``a`` bytes of the compute dtype (2 for bfloat16/float16 under autocast, 4 for float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeper.memory._shapes import ModelShape, known_shape
from sweeper.space import TrialConfig

#: The schema's defaults (:class:`sweeper.space.TrialConfig`), which :class:`MemorySettings` takes as its own.
_TRIAL = TrialConfig()

GIB = 2**30

#: bitsandbytes 4-bit blocksize (``bnb.functional.quantize_4bit``): one absmax constant per 64 weights.
BLOCKSIZE_4BIT = 64
#: Double quantization quantizes the absmax constants in blocks of 256 (``quantize_4bit(compress_statistics=True)``).
BLOCKSIZE_NESTED = 256
#: bitsandbytes 8-bit optimizers keep 32-bit state for tensors smaller than this (``Optimizer8bit min_8bit_size``).
MIN_8BIT_SIZE = 4096
#: Blocksize of the 8-bit optimizer states' absmax (``bnb.optim`` blockwise quantization).
BLOCKSIZE_8BIT_OPTIM = 256
#: On CUDA the peak is ``torch.cuda.max_memory_reserved()``. The CUDA context lives outside the caching allocator, so
#: it is in neither that peak nor the cap of ``set_per_process_memory_fraction``: ``memory_limit_gib: auto`` keeps it
#: off the card's size instead (:mod:`sweeper.devices._card`). Weights and optimizer state are reserved as held (a
#: fitted constant came out at 0.05 GiB, and the fixed terms matched the rows' intercept within 0.04 GiB). What the
#: bytes the CPU tests count get wrong on a GPU is in the parts that grow with tokens, fitted on an H200
#: (``benchmarks/gpu/fit_cuda_memory.py`` on ``benchmarks/gpu/results/gpu-h200-2026-12-04-train``: fitted on the 8 rows
#: at r 16; on the 7 rows at r 64, held out, median error 1.2%, largest 3.5%, against 16.6% and 29.0% before): the
#: tensors saved for backward, activations and the recomputed layer, times this factor (the caching allocator held
#: 25% less than the tensors autograd saves on the CPU) ...
CUDA_ACTIVATION_FACTOR = 0.748
#: ... and the logits' bytes that grow with tokens (saved and transient; lm_head's compute-dtype copy is fixed) times
#: this one: the loss's region held about one more float32 copy of the logits than counted.
CUDA_LOGITS_FACTOR = 1.461
#: On the CPU a trial's peak is its resident set, which also holds Python, torch, transformers, peft and
#: bitsandbytes: measured 0.54 GiB for a trial of the tests' tiny model, of which the model is a few MB.
CPU_PROCESS_BASELINE_GIB = 0.45

#: Optimizer state bytes per trainable parameter, for the 32-bit optimizers (two fp32 moments for AdamW).
_STATE_BYTES_32 = {
    "adamw_torch": 8,
    "adamw_torch_fused": 8,
    "paged_adamw_32bit": 8,
    "lion_32bit": 4,
    "paged_lion_32bit": 4,
    "sgd": 0,
}
#: Number of 8-bit states of the bitsandbytes 8-bit optimizers.
_STATES_8BIT = {"adamw_8bit": 2, "adamw_bnb_8bit": 2, "paged_adamw_8bit": 2, "lion_8bit": 1, "paged_lion_8bit": 1}


@dataclass(frozen=True, kw_only=True)
class MemorySettings:
    """The trial settings memory depends on (:data:`MEMORY_KEYS`, names and defaults from
    :class:`sweeper.space.TrialConfig`, the one schema), the model's attention implementation, and the device the
    peak is predicted for (``cuda``: reserved memory; ``cpu``: the trial process's resident set)."""

    r: int = _TRIAL.r
    target_modules: Sequence[str] = _TRIAL.target_modules
    bnb_4bit_compute_dtype: str = _TRIAL.bnb_4bit_compute_dtype
    bnb_4bit_use_double_quant: bool = _TRIAL.bnb_4bit_use_double_quant
    per_device_train_batch_size: int = _TRIAL.per_device_train_batch_size
    max_seq_length: int = _TRIAL.max_seq_length
    gradient_checkpointing: bool = _TRIAL.gradient_checkpointing
    optim: str = _TRIAL.optim
    lora_dropout: float = _TRIAL.lora_dropout
    attn_implementation: str = _TRIAL.model.attn_implementation
    device: str = "cuda"


def quantized_weight_bytes(shape: ModelShape, double_quant: bool) -> int:
    """Bytes of the 4-bit linear layers (every projection of every layer; lm_head stays unquantized).

    Per layer of ``n = in * out`` weights: ``n / 2`` packed bytes, plus the absmax constants: without double quant
    ``n / 64`` float32 values; with it ``n / 64`` uint8 values, ``ceil(n / 64 / 256)`` float32 second-level absmax
    and the 256-entry float32 code of the second level; plus the 16-entry float32 NF4/FP4 code. In the large-n limit
    that is 4.5 or 4.127 bits per weight, the 0.5 and 0.127 extra bits of the QLoRA paper (Dettmers et al. 2023,
    section 3, "Double Quantization"); the exact count is that of ``bitsandbytes.functional.quantize_4bit``.
    """
    total = 0
    for d_in, d_out in shape.linear_shapes().values():
        n = d_in * d_out
        blocks = math.ceil(n / BLOCKSIZE_4BIT)
        constants = (blocks + math.ceil(blocks / BLOCKSIZE_NESTED) * 4 + 256 * 4) if double_quant else blocks * 4
        total += n // 2 + constants + 16 * 4
    return total * shape.num_hidden_layers


def unquantized_weight_bytes(shape: ModelShape) -> int:
    """Bytes of the layers bitsandbytes leaves unquantized, in float32: peft's ``prepare_model_for_kbit_training``
    casts every float16/bfloat16 parameter to float32 (``peft/utils/other.py``). Embedding ``V * h``, lm_head
    ``h * V`` unless tied, and the RMSNorm weights ``(2 L + 1) * h``."""
    h, v = shape.hidden_size, shape.vocab_size
    params = v * h + (0 if shape.tie_word_embeddings else h * v) + (2 * shape.num_hidden_layers + 1) * h
    return 4 * params


def lora_parameter_count(shape: ModelShape, r: int, target_modules: Sequence[str]) -> list[int]:
    """Element counts of the LoRA tensors: ``A`` is ``r x in``, ``B`` is ``out x r``, per target module and layer."""
    out = []
    for name, (d_in, d_out) in shape.linear_shapes().items():
        if name in target_modules:
            out += [r * d_in, d_out * r] * shape.num_hidden_layers
    return out


def lora_weight_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """LoRA weights in float32 (peft creates them in the base layer's dtype, float32 after preparation): 4 bytes per
    element of :func:`lora_parameter_count`."""
    return 4 * sum(lora_parameter_count(shape, s.r, s.target_modules))


def gradient_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """Gradients of the LoRA weights: float32, one per weight (the frozen 4-bit weights have none)."""
    return lora_weight_bytes(shape, s)


def optimizer_state_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """Optimizer state of the LoRA weights.

    32-bit optimizers: AdamW keeps two float32 moments (8 bytes per weight), Lion one, SGD without momentum none.
    bitsandbytes 8-bit optimizers (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization") keep each
    state in 1 byte per weight plus one float32 absmax per block of 256, but fall back to 32-bit states for tensors
    under 4096 elements (``min_8bit_size``). ``adafactor`` keeps factored second moments: ``rows + cols`` float32 per
    matrix. Paged variants count as GPU memory (they live there until the driver pages them out).
    """
    sizes = lora_parameter_count(shape, s.r, s.target_modules)
    if s.optim in _STATES_8BIT:
        states = _STATES_8BIT[s.optim]
        total = 0
        for n in sizes:
            if n < MIN_8BIT_SIZE:
                total += states * 4 * n
            else:
                total += states * (n + 4 * math.ceil(n / BLOCKSIZE_8BIT_OPTIM))
        return total
    if s.optim == "adafactor":
        return 4 * sum(s.r + n // s.r for n in sizes)
    return _STATE_BYTES_32.get(s.optim, 8) * sum(sizes)


def _compute_bytes(s: MemorySettings) -> int:
    """``a``: 2 under autocast (bf16/fp16 on CUDA, bf16 on the CPU), 4 in float32 and for fp16 on the CPU, where
    accelerate runs no autocast (the 4-bit layers still compute in fp16 inside, returning float32)."""
    if s.bnb_4bit_compute_dtype == "float32" or (s.device == "cpu" and s.bnb_4bit_compute_dtype == "float16"):
        return 4
    return 2


def layer_activation_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """Bytes one decoder layer saves for backward without gradient checkpointing.

    Counted from the tensors autograd saves in a peft QLoRA Llama layer (``tests/memory/test_estimate.py`` lists them
    with ``saved_tensors_hooks``), Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models", section 4) adapted to what QLoRA keeps: the frozen 4-bit matmuls save nothing (their input gradient needs
    only the weight), so the cost is in the residual stream (float32 after ``prepare_model_for_kbit_training``), the
    SwiGLU MLP, attention and the LoRA branches:

    - each RMSNorm: its float32 input ``4 T h`` and ``rsqrt`` ``4 T``;
    - each LoRA target ``in -> out``: the dropout mask ``4 T in`` (none when ``lora_dropout`` is 0), lora_A's input
      ``a T in`` (in float32 without dropout it is the layer's own tensor, saved once per distinct input), lora_B's
      input ``a T r``, and under autocast the compute-dtype copies of both LoRA weights ``a r (in + out)``;
    - SDPA / flash attention: q and the output ``a T q`` each, k and v ``a T kv`` each (grouped-query attention
      keeps k and v at the KV heads), the float32 logsumexp ``4 T heads``; no ``s^2`` term. Eager attention saves q
      and k, v repeated to every head, ``3 a T q``, and the probabilities, float32 and their compute-dtype cast,
      ``(4 + a) b heads s^2``;
    - SwiGLU: SiLU's input and both inputs of the product, ``3 * 4 T i`` (float32: the 4-bit layers return the input's
      dtype).
    """
    t = s.per_device_train_batch_size * s.max_seq_length
    a = _compute_bytes(s)
    h, i = shape.hidden_size, shape.intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    total = 2 * (4 * t * h + 4 * t)  # two RMSNorms
    linears = shape.linear_shapes()
    for name, (d_in, d_out) in linears.items():
        if name not in s.target_modules:
            continue
        mask = 4 * t * d_in if s.lora_dropout > 0 else 0
        own_input = a * t * d_in if (s.lora_dropout > 0 or a != 4) else 0  # a dropout output or an autocast copy
        weights = a * s.r * (d_in + d_out) if a != 4 else 0
        total += mask + own_input + a * t * s.r + weights
    if a == 4 and s.lora_dropout == 0:
        # In float32 without dropout lora_A reads the layer's own tensors, one saved copy per distinct input: the
        # normed input (shared by q/k/v, and by gate/up) and the MLP product; o_proj's input is SDPA's saved output.
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("down_proj",)):
            if any(name in s.target_modules for name in group):
                total += 4 * t * linears[group[0]][0]
    if s.attn_implementation == "eager":
        # q, and k, v repeated to every head (repeat_kv), and the s x s probabilities: float32 softmax output plus
        # its compute-dtype cast.
        square = s.per_device_train_batch_size * shape.num_attention_heads * s.max_seq_length**2
        total += 3 * a * t * q + (4 + (a if a != 4 else 0)) * square
    else:
        total += a * t * (2 * q + 2 * kv) + 4 * t * shape.num_attention_heads
    total += 3 * 4 * t * i
    return total


def activation_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """Bytes saved for backward by all layers, at the end of the forward pass.

    Without checkpointing: ``L`` times :func:`layer_activation_bytes`, the final RMSNorm (``4 T h + 4 T``) and the
    rotary cos/sin (``2 * 4 s head_dim``). With (non-reentrant) gradient checkpointing each layer keeps only its
    float32 input, ``4 T h``, and the final RMSNorm's tensors.
    """
    t = s.per_device_train_batch_size * s.max_seq_length
    h = shape.hidden_size
    final_norm = 4 * t * h + 4 * t
    if s.gradient_checkpointing:
        return shape.num_hidden_layers * 4 * t * h + final_norm
    # Without checkpointing peft leaves the embedding output without grad: the first layer's input RMSNorm and the
    # dropout masks of its q/k/v LoRA branches save nothing (no gradient flows to the embedding).
    first_layer_saving = 4 * t * h + 4 * t
    if s.lora_dropout > 0:
        first_layer_saving += sum(4 * t * h for name in ("q_proj", "k_proj", "v_proj") if name in s.target_modules)
    return (
        shape.num_hidden_layers * layer_activation_bytes(shape, s)
        - first_layer_saving
        + final_norm
        + 2 * 4 * s.max_seq_length * shape.head_dim
    )


def recompute_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """With gradient checkpointing, the backward pass recomputes one layer at a time: that layer's activations are
    held on top of the checkpoints (0 without checkpointing)."""
    return layer_activation_bytes(shape, s) if s.gradient_checkpointing else 0


def head_copy_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """lm_head's compute-dtype weight copy under autocast, ``a h V`` (0 in float32): the part of
    :func:`logits_saved_bytes` that does not grow with tokens."""
    a = _compute_bytes(s)
    return a * shape.hidden_size * shape.vocab_size if a != 4 else 0


def logits_saved_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """What the head saves for the loss: the float32 logits cross-entropy keeps (``4 T V``; transformers upcasts the
    logits before the loss), the int64 labels ``8 T``, and under autocast lm_head's compute-dtype weight copy
    (``a h V``)."""
    t = s.per_device_train_batch_size * s.max_seq_length
    return 4 * t * shape.vocab_size + 8 * t + head_copy_bytes(shape, s)


def logits_transient_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """Logit tensors alive around the loss besides the saved ones: the compute-dtype logits before the upcast and the
    float32 gradient of the logits in backward, ``(a + 4) T V``."""
    t = s.per_device_train_batch_size * s.max_seq_length
    return (_compute_bytes(s) + 4) * t * shape.vocab_size


def dequantization_bytes(shape: ModelShape, s: MemorySettings) -> int:
    """bitsandbytes dequantizes one 4-bit weight at a time to the compute dtype for its matmul (forward, and backward
    for the input gradient): the largest projection, ``a * in * out``."""
    return _compute_bytes(s) * max(d_in * d_out for d_in, d_out in shape.linear_shapes().values())


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """A predicted peak and its terms.

    Attributes:
        predicted_peak_gib: The sum of the terms.
        terms_gib: Each term in GiB, by name (``quantized_weights``, ``unquantized_weights``, ``lora_weights``,
            ``gradients``, ``optimizer_state``, ``activations``, ``recompute``, ``logits_saved``,
            ``logits_transient``, ``dequantization``; on the CPU ``process_baseline``). On CUDA ``activations`` and
            ``recompute`` are times :data:`CUDA_ACTIVATION_FACTOR` and the logits' token-proportional bytes times
            :data:`CUDA_LOGITS_FACTOR`.
    """

    predicted_peak_gib: float
    terms_gib: dict[str, float] = field(default_factory=dict)


def estimate_memory(shape: ModelShape, s: MemorySettings) -> MemoryEstimate:
    """The predicted peak GPU memory (``torch.cuda.max_memory_reserved``) of a QLoRA training step; with
    ``device="cpu"``, the peak resident set of a CPU trial (plus the process's own :data:`CPU_PROCESS_BASELINE_GIB`).

    The peak is at the loss: every weight and optimizer state, all saved activations, the logits, and one
    dequantized weight; with checkpointing, backward adds one recomputed layer (counted too, a slight over-estimate
    since the logits are freed by then). On CUDA two factors fitted on an H200 scale the terms that grow with tokens
    (:data:`CUDA_ACTIVATION_FACTOR`, :data:`CUDA_LOGITS_FACTOR`; docs/memory.md gives their error on rows not used
    to fit); the CUDA context is not in the peak (it is outside the allocator, as it is outside the cap).
    """
    terms = {
        "quantized_weights": quantized_weight_bytes(shape, s.bnb_4bit_use_double_quant),
        "unquantized_weights": unquantized_weight_bytes(shape),
        "lora_weights": lora_weight_bytes(shape, s),
        "gradients": gradient_bytes(shape, s),
        "optimizer_state": optimizer_state_bytes(shape, s),
        "activations": activation_bytes(shape, s),
        "recompute": recompute_bytes(shape, s),
        "logits_saved": logits_saved_bytes(shape, s),
        "logits_transient": logits_transient_bytes(shape, s),
        "dequantization": dequantization_bytes(shape, s),
    }
    terms_gib = {k: v / GIB for k, v in terms.items()}
    if s.device == "cpu":  # glibc's allocator returns what is freed; the process itself is the fixed cost
        terms_gib["process_baseline"] = CPU_PROCESS_BASELINE_GIB
        return MemoryEstimate(predicted_peak_gib=sum(terms_gib.values()), terms_gib=terms_gib)
    head = head_copy_bytes(shape, s) / GIB
    terms_gib["activations"] *= CUDA_ACTIVATION_FACTOR
    terms_gib["recompute"] *= CUDA_ACTIVATION_FACTOR
    terms_gib["logits_saved"] = head + CUDA_LOGITS_FACTOR * (terms_gib["logits_saved"] - head)
    terms_gib["logits_transient"] *= CUDA_LOGITS_FACTOR
    return MemoryEstimate(predicted_peak_gib=sum(terms_gib.values()), terms_gib=terms_gib)


#: The trial keys the memory model reads: every key of memory role ``grows`` or ``shrinks`` and some of role ``same``
#: (:attr:`sweeper.space._schema.KeySpec.memory`); a key of role ``none`` (lora_alpha_ratio, learning_rate, quant type,
#: ...) does not change memory (``tests/memory/test_memory_roles.py`` checks both).
MEMORY_KEYS = (
    "r",
    "target_modules",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_use_double_quant",
    "per_device_train_batch_size",
    "max_seq_length",
    "gradient_checkpointing",
    "optim",
    "lora_dropout",
)


def settings_from(config: TrialConfig, attn_implementation: str = "sdpa", device: str = "cuda") -> MemorySettings:
    """:class:`MemorySettings` from a trial's settings (:data:`MEMORY_KEYS` of it)."""
    chosen: dict[str, Any] = {k: getattr(config, k) for k in MEMORY_KEYS}
    return MemorySettings(
        **chosen,
        attn_implementation=attn_implementation,
        device=device,
    )


def memory_predictor(
    model_path: str, name: str, attn_implementation: str, device: str
) -> Callable[[TrialConfig], float | None]:
    """A function from a trial config to its predicted peak in GiB (:func:`estimate_memory`) on ``device`` (``cuda``
    or ``cpu``: the device the trials will use); it returns None when the model's shape is unknown (no readable
    ``config.json``)."""
    known = known_shape(name)
    try:
        shape = ModelShape.from_config(known) if known else ModelShape.from_dir(model_path)
    except (OSError, ValueError, KeyError):
        return lambda config: None

    def predict(config: TrialConfig) -> float | None:
        return estimate_memory(shape, settings_from(config, attn_implementation, device)).predicted_peak_gib

    return predict
