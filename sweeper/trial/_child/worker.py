"""The child side of a trial: the only place that trains.

``python -m sweeper.trial._child.worker --serve`` is a trial process that serves trials one after another (a *warm*
process, as Ray Tune's ``reuse_actors``): it imports torch, transformers, peft and bitsandbytes once, reads jobs as
JSON lines on stdin (``config_path``, ``result_path``, ``log_path``, ``trial_dir``), and after each writes the
:class:`~sweeper.trial.TrialResult` as JSON and one line on the control pipe (``SWEEPER_CONTROL_FD``) saying whether
it can take another trial. Per trial it caps its own memory, loads the model in 4 bits with bitsandbytes (or keeps
the one it loaded for the previous trial when the model-level settings match, :func:`model_key`), checks the
quantization took effect, attaches a peft LoRA adapter, trains ``max_steps`` optimizer steps with
``transformers.Trainer`` while recording the raw loss, the pre-clip gradient norm, fp16 scaler skips and the largest
activation of every step, and restores the base model afterwards. It stops at the first non-finite loss or gradient
norm (``nan``) and turns a real allocation failure into ``oom``, naming the phase. After anything but a ``complete``
or ``diverged`` trial it exits: the next trial runs in a fresh process.

``python -m sweeper.trial._child.worker CONFIG.json RESULT.json`` runs one trial and exits (for debugging).
"""

from __future__ import annotations

if __name__ == "__main__":  # first thing, before the heavy imports below (seconds): die with the sweep
    from sweeper.trial._child._process import die_with_parent

    die_with_parent()

import ctypes
import gc
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from sweeper.checkpoint import checkpoint_dtype
from sweeper.space import TrialConfig
from sweeper.stability import PROBE_ROWS, compute_instability, probe_interval_steps, projected_fail_step
from sweeper.trial._child.instrumented import (
    DivergedError,
    NonFiniteError,
    Probe,
    TrainingRecord,
    finite_or_none,
    make_collator,
    make_trainer,
    track_activations,
)
from sweeper.trial._child.memory import (
    lift_cpu_memory_cap,
    mentions_oom,
    oom_cause_chain,
    peak_memory_gib,
    process_memory_gib,
    reset_cpu_peak,
    set_cpu_memory_cap,
)
from sweeper.trial._devices import cuda_visible
from sweeper.trial._result import TrialResult, TrialStatus

#: Kept allocated while the trial runs and released after an OOM, so the result can still be written under the cap.
_RESERVE_BYTES = 32 * 2**20


class QuantizationCheckError(Exception):
    """The loaded model is not quantized, or not adapted, as the trial asked."""


class _LoadReport(logging.Handler):
    """Keeps what transformers reports while loading weights: an allocation failure inside its weight conversion
    reaches us only as text in that report, behind a generic RuntimeError."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def mentions_oom(self) -> bool:
        return any(mentions_oom(m) for m in self.messages)


_LOAD_REPORT = _LoadReport()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes", "optuna", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    import torch

    out["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    return out


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


def _probe(rows: list[dict[str, Any]], collate: Any, config: TrialConfig) -> Probe | None:
    """The probe: the first :data:`~sweeper.stability.PROBE_ROWS` rows of the trial's data that keep a supervised
    token after truncation, collated as training collates them; None when no row has one, or when
    ``SWEEPER_PROBE_INTERVAL_STEPS=0`` turns it off (a diagnostic: the tests compare training with and without it)."""
    override = os.environ.get("SWEEPER_PROBE_INTERVAL_STEPS", "").strip()
    if override == "0":
        return None
    chosen = [row for row in rows if any(label != -100 for label in row["labels"][1:])][:PROBE_ROWS]
    if not chosen:
        return None
    batch = collate(chosen)
    batch.pop("sample_index")
    interval = probe_interval_steps(config.per_device_train_batch_size, config.gradient_accumulation_steps)
    if override.isdigit():
        interval = int(override)
    return Probe(batch=batch, interval_steps=interval, max_steps=config.max_steps)


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
    ``bnb_4bit_use_double_quant``, and the dtype the weights are loaded in (the compute dtype: a cold trial loads in
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
        load,
    )


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
        reusable: Whether this process may take another trial (set by :func:`run`).
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


def _import_heavy() -> float:
    """Import torch, transformers, peft and bitsandbytes; seconds it took (about 0 when already imported)."""
    start = time.monotonic()
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers
    from transformers import Trainer  # noqa: F401

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return time.monotonic() - start


def _load_model(config: TrialConfig, model_path: str, cuda: bool) -> Any:
    """``from_pretrained`` in 4 bits, as a cold trial (and the production run) loads it."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.utils import logging as transformers_logging

    compute_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=config.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=config.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    # transformers reports a weight-conversion failure (an allocation that failed under the cap among them) as a
    # warning from whichever of its loggers loads the model, then raises a bare RuntimeError: its warnings are let
    # through while loading, into worker.log and into _LOAD_REPORT, which tells an OOM from another error.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    root = logging.getLogger("transformers")
    root.addHandler(_LOAD_REPORT)
    try:
        return AutoModelForCausalLM.from_pretrained(
            model_path,
            quantization_config=quantization,
            dtype=compute_dtype,  # unquantized layers load in the compute dtype; peft upcasts them to fp32 below
            attn_implementation=config.model.attn_implementation,
            trust_remote_code=config.model.trust_remote_code,
            device_map={"": 0} if cuda else None,
        )
    finally:
        root.removeHandler(_LOAD_REPORT)
        transformers_logging.set_verbosity(verbosity)


def _base_model(
    config: TrialConfig, model_path: str, cuda: bool, warm: WarmState, measured: dict[str, Any]
) -> tuple[Any, tuple[Any, ...]]:
    """The trial's 4-bit base model: the kept one when its :func:`model_key` matches (its compute dtype switched in
    place), else a fresh load after the kept one was dropped (two never coexist)."""
    import bitsandbytes as bnb
    import torch

    key = model_key(config, model_path)
    measured["model_reused"] = warm.model is not None and warm.model_key == key
    if not measured["model_reused"]:
        warm.drop_model()
        return _load_model(config, model_path, cuda), key
    model, warm.model, warm.model_key = warm.model, None, None
    compute_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.compute_dtype = compute_dtype
            module.compute_type_is_set = True
            # The dtype the 4-bit weight dequantizes to: a cold load records the dtype it quantized from, the
            # compute dtype (with another one, bf16 -> fp32 the trace differed from step 1 on: measured).
            module.weight.quant_state.dtype = compute_dtype  # type: ignore[attr-defined]
    model.config.dtype = compute_dtype
    return model, key


def _restore_base(peft_model: Any, hooks: list[Any]) -> Any | None:
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


def train(
    config: TrialConfig,
    model_path: str,
    record: TrainingRecord,
    measured: dict[str, Any],
    warm: WarmState | None = None,
) -> None:
    """Load (or reuse), check, adapt and train, writing measurements (named as :class:`TrialResult` fields) into
    ``measured`` as they become known; with ``warm``, keep the restored base model there for the next trial when
    training ended as ``complete`` or ``diverged``. Exceptions propagate to :func:`run`."""
    warm = warm if warm is not None else WarmState()
    measured["import_time_s"] = _import_heavy()
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import TrainingArguments

    from sweeper.data import load_samples, load_tokenizer, tokenize_samples

    t_load = time.monotonic()
    cuda = torch.cuda.is_available()
    if cuda:
        from sweeper.trial._child.memory import set_cuda_memory_cap

        set_cuda_memory_cap(config.memory_limit_gib)
    measured["device"] = f"cuda:0 ({torch.cuda.get_device_name(0)})" if cuda else "cpu"

    tokenizer_key = (model_path, config.model.trust_remote_code)
    if tokenizer_key not in warm.tokenizers:
        warm.tokenizers[tokenizer_key] = load_tokenizer(model_path, config.model.trust_remote_code)
    tokenizer = warm.tokenizers[tokenizer_key]
    dataset_key = json.dumps(config.to_dict()["dataset"], sort_keys=True, default=str)
    if warm.samples is None or warm.samples[0] != dataset_key:
        warm.samples = (dataset_key, load_samples(config.dataset))
    samples = warm.samples[1]
    tokenized = tokenize_samples(samples, tokenizer, config.max_seq_length)
    rows = [{"input_ids": t.input_ids, "labels": t.labels, "index": t.index} for t in tokenized]

    model, key = _base_model(config, model_path, cuda, warm, measured)
    measured["quantized_linear_count"] = check_quantization(model, config)
    model = prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    transformers.set_seed(config.seed)
    model = get_peft_model(
        model,
        LoraConfig(
            r=config.r,
            lora_alpha=config.lora_alpha,  # type: ignore[arg-type]
            target_modules=list(config.target_modules),
            lora_dropout=config.lora_dropout,
            bias="none",
            task_type="CAUSAL_LM",
        ),
    )
    check_lora_targets(model, config)
    hooks = track_activations(model, record) if config.bnb_4bit_compute_dtype != "float32" else []

    # transformers 5.23 renamed gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs); the old names
    # warn there (removed in v6), and releases before 5.23 know only them.
    checkpointing = "activation_checkpointing"
    if checkpointing not in TrainingArguments.__dataclass_fields__:
        checkpointing = "gradient_checkpointing"
    checkpointing_args: dict[str, Any] = {
        checkpointing: config.gradient_checkpointing,
        f"{checkpointing}_kwargs": {"use_reentrant": False},
    }
    args = TrainingArguments(
        output_dir=str(Path(os.environ.get("SWEEPER_TRIAL_DIR", ".")) / "trainer"),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        # Constant after warmup: a short run should probe the peak learning rate a long run spends most steps at,
        # not a rate already decayed toward 0.
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        optim=config.optim,
        **checkpointing_args,
        max_grad_norm=config.max_grad_norm,
        bf16=config.bnb_4bit_compute_dtype == "bfloat16",
        fp16=config.bnb_4bit_compute_dtype == "float16",
        seed=config.seed,
        use_cpu=not cuda,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    collate = make_collator(tokenizer.pad_token_id, config.max_seq_length)
    trainer = make_trainer(model, args, rows, collate, record, _probe(rows, collate, config))
    measured["load_time_s"] = time.monotonic() - t_load
    measured["load_peak_memory_gib"] = peak_memory_gib("cuda" if cuda else "cpu")
    if not cuda:
        # See sweeper.trial._child.memory: on the CPU the training-phase peak stands for the card. What loading freed
        # is handed back first, so the peak starts from what the process holds, not from when glibc last trimmed.
        release_memory()
        reset_cpu_peak()

    t_train = measured["t_train_start"] = time.monotonic()
    record.phase = "forward"
    n_tokens = {t.index: t.n_tokens for t in tokenized}
    by_index = {s.index: s for s in samples}
    kept = False
    try:
        trainer.train()
        kept = True
    except DivergedError:
        kept = True
        raise
    except NonFiniteError as exc:
        measured["train_time_s"] = time.monotonic() - t_train
        try:
            exc.diagnosis = _diagnose(exc, trainer, config, record, tokenizer)
            _write_nan_batch(exc.diagnosis, tokenizer, by_index, record.step + 1)
        except Exception:
            traceback.print_exc()
        raise
    finally:
        measured.setdefault("train_time_s", time.monotonic() - t_train)
        measured.update(_seen_lengths(record, n_tokens, config.max_seq_length))
        if kept:  # the next trial of this process may reuse the base model
            peft_model = trainer.model
            trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
            del trainer
            warm.model = _restore_base(peft_model, hooks)
            warm.model_key = key if warm.model is not None else None
            del peft_model, model
        else:
            del trainer, model


def _diagnose(exc: NonFiniteError, trainer: Any, config: TrialConfig, record: TrainingRecord, tokenizer: Any) -> Any:
    """Why the step failed (:func:`sweeper.trial._child.diagnosis.diagnose_nan`), on the weights it failed on."""
    from sweeper.trial._child.diagnosis import diagnose_nan

    model = trainer.model
    model.zero_grad(set_to_none=True)  # the failed step's gradients: memory the replay may need
    gc.collect()
    return diagnose_nan(
        model,
        step_batches=record.step_batches,
        control_batches=record.last_batches,
        vocab_size=model.get_input_embeddings().num_embeddings,
        failed_in=exc.what,  # type: ignore[arg-type]
        compute_dtype=config.bnb_4bit_compute_dtype,
        grad_norm_trace=record.grad_norm,
        learning_rate=config.learning_rate,
        lora_alpha_ratio=config.lora_alpha_ratio,
        max_seq_length=config.max_seq_length,
        precision=trainer.compute_loss_context_manager,
        tokenizer=tokenizer,
    )


def _write_nan_batch(diagnosis: Any, tokenizer: Any, samples: dict[int, Any], step: int) -> None:
    """The failing step's rows as ``nan_batch.jsonl`` in the trial's folder, one JSON object per row (README, "What a
    trial is and records"): ``step``, ``index``, ``tokens_trained``, ``tokens_before_truncation``, ``truncated``,
    ``micro_batch``, ``supervised_tokens``, ``invalid_token_ids``, ``nonfinite_inputs``, ``fp32_loss``,
    ``fp32_finite``, ``at_fault``, ``text`` (decoded as trained) and ``text_cut_away`` (what truncation removed)."""
    from sweeper.data import tokenize_samples

    folder = Path(os.environ.get("SWEEPER_TRIAL_DIR", "."))
    lines = []
    for row in diagnosis.rows:
        record = {"step": step, **row.to_dict()}
        sample = samples.get(row.index)
        full = tokenize_samples([sample], tokenizer, sys.maxsize)[0].input_ids if sample is not None else []
        cut = full[len(row.input_ids) :]
        record.update(
            tokens_before_truncation=len(full) or None,
            truncated=bool(cut),
            text=tokenizer.decode(row.input_ids, skip_special_tokens=False),
            text_cut_away=tokenizer.decode(cut, skip_special_tokens=False),
        )
        lines.append(json.dumps(record, ensure_ascii=False))
    tmp = folder / "nan_batch.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, folder / "nan_batch.jsonl")


def _seen_lengths(record: TrainingRecord, n_tokens: dict[int, int], max_seq_length: int) -> dict[str, Any]:
    """``longest_sample_tokens``, ``longest_sample_index`` and ``truncated_sample_fraction`` over the samples the
    trial trained on (tokens before truncation), and the supervised-token counts per step."""
    supervised = list(record.supervised)
    if record.step_supervised is not None and len(record.step_batches) > 0:
        supervised.append(record.step_supervised)  # the failing step, when it failed
    out: dict[str, Any] = {
        "supervised_tokens_trace": supervised,
        "min_supervised_tokens": min(supervised) if supervised else None,
    }
    seen = [(n_tokens[i], i) for i in record.seen if i in n_tokens]
    if seen:
        longest, index = max(seen)
        out.update(
            longest_sample_tokens=longest,
            longest_sample_index=index,
            truncated_sample_fraction=sum(1 for n, _ in seen if n > max_seq_length) / len(seen),
        )
    return out


def _reset_peaks() -> None:
    """Start this trial's peak statistics from what the process holds now (CUDA and the CPU high-water mark)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    reset_cpu_peak()


def run(config: TrialConfig, model_path: str, warm: WarmState | None = None) -> TrialResult:
    """Run one trial in this process and return its result; never raises for a trial's own failure.

    Args:
        config: The trial.
        model_path: A local checkpoint (:func:`sweeper.model.resolve_model`).
        warm: What this process kept from earlier trials (:class:`WarmState`); updated in place, and its
            ``reusable`` says whether the process may take another trial: only after ``complete`` or ``diverged``
            (an OOM, error or NaN leaves the process as a fresh one would not be: the NaN diagnosis replays rows
            outside training mode, which on some CPUs repacks the 4-bit weights).
    """
    warm = warm if warm is not None else WarmState()
    t_setup = time.monotonic()
    release_memory()
    _LOAD_REPORT.messages.clear()
    held = process_memory_gib()
    print(
        f"sweeper: trial {warm.trials + 1} of this process; it holds "
        + ", ".join(f"{k} {v:.3f} GiB" for k, v in held.items()),
        file=sys.stderr,
        flush=True,
    )
    if warm.base_gap_gib is None and "VmData" in held and "VmRSS" in held:
        warm.base_gap_gib = held["VmData"] - held["VmRSS"]
    reserve = bytearray(_RESERVE_BYTES)  # resident: it does not change the allowance below
    if not cuda_visible():
        allowance = warm.set_cpu_cap(config.memory_limit_gib)
        if allowance:
            print(f"sweeper: cap raised by {allowance:.3f} GiB freed by earlier trials", file=sys.stderr, flush=True)
    _reset_peaks()
    record = TrainingRecord()
    measured: dict[str, Any] = {"warm": warm.trials > 0, "model_reused": False}
    result = TrialResult(
        status=TrialStatus.COMPLETE, lora_alpha=config.lora_alpha, effective_batch_size=config.effective_batch_size
    )
    try:
        train(config, model_path, record, measured, warm)
        result.reason = f"{record.step} steps finished"
    except NonFiniteError as exc:
        result.status, result.fail_phase = TrialStatus.NAN, exc.phase  # type: ignore[assignment]
        result.fail_step = record.step + 1
        result.reason = exc.describe(result.fail_step)
        diagnosis = exc.diagnosis
        if diagnosis is not None:
            result.reason += f"; {diagnosis.reason}"
            result.nan_cause, result.nan_samples, result.nan_module = (
                diagnosis.cause,
                diagnosis.samples,
                diagnosis.module,
            )
    except DivergedError as exc:
        result.status, result.fail_step = TrialStatus.DIVERGED, exc.divergence.step
        result.reason = exc.divergence.reason
    except QuantizationCheckError as exc:
        what = "LoRA target check" if "target_modules" in str(exc) else "4-bit quantization check"
        result.status, result.reason = TrialStatus.ERROR, f"{what} failed: {exc}"
        result.fail_phase, result.fail_step = "load", 0
    except BaseException as exc:
        reserve = None  # type: ignore[assignment]  # after an OOM, room to build and write the result under the cap
        gc.collect()
        result.fail_phase = record.phase  # type: ignore[assignment]
        result.fail_step = 0 if record.phase == "load" else record.step + 1
        where = "while loading" if record.phase == "load" else f"at step {result.fail_step} ({record.phase})"
        if oom_cause_chain(exc) is not None or (record.phase == "load" and _LOAD_REPORT.mentions_oom()):
            result.status = TrialStatus.OOM
            result.reason = f"out of memory {where} under memory_limit_gib={config.memory_limit_gib:g}"
            if record.phase != "load":  # every row is padded to max_seq_length: that is the step's length
                result.reason += (
                    f" on a step of {config.per_device_train_batch_size} x {config.max_seq_length} "
                    f"tokens (per_device_train_batch_size={config.per_device_train_batch_size}, "
                    f"max_seq_length={config.max_seq_length})"
                )
        else:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            result.status = TrialStatus.ERROR
            result.reason = f"{type(exc).__name__} {where}" + (f": {first}" if first else "")
            traceback.print_exc()
    del reserve
    if not cuda_visible():
        lift_cpu_memory_cap()
    warm.cap_gib = None
    warm.trials += 1
    warm.reusable = result.status in ("complete", "diverged") and warm.model is not None
    if not warm.reusable:
        warm.drop_model()
    gc.collect()
    torch = sys.modules.get("torch")
    device_type = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    result.peak_memory_gib = peak_memory_gib(device_type)
    result.memory_kind = "cuda_max_reserved" if device_type == "cuda" else "cpu_peak_rss"
    result.device = device_type
    if torch is not None:
        result.versions = _versions()
    result.steps_done = record.step
    result.loss_trace, result.grad_norm_trace = record.loss, record.grad_norm
    result.max_activation_trace, result.skipped_steps = record.max_activation, record.skipped
    if result.status == "nan":  # the failing step's values, for the curves
        result.loss_trace = record.loss + [finite_or_none(record.step_loss)]
        result.grad_norm_trace = record.grad_norm + [finite_or_none(record.step_grad_norm)]
    for key, value in measured.items():
        if hasattr(result, key):
            setattr(result, key, value)
    if "load_time_s" in measured:
        result.setup_time_s = measured["t_train_start"] - t_setup
    if measured.get("train_time_s"):
        result.tokens_per_s = record.tokens / measured["train_time_s"]
    result.probe_steps, result.probe_loss_trace = record.probe_steps, record.probe_loss
    result.probe_max_activation_trace = record.probe_max_activation
    result.probe_time_s = record.probe_time_s
    training_s = (measured.get("train_time_s") or 0.0) - record.probe_time_s
    result.probe_time_share = record.probe_time_s / training_s if training_s > 0 and record.probe_steps else None
    if result.status not in ("complete", "nan", "diverged"):
        return result  # too few steps for the instability terms to mean anything
    if result.nan_cause == "data":
        return result  # the data failed, not the configuration: its trace says nothing about stability
    if not record.probe_steps:
        return result  # no probe (no row keeps a supervised token, or turned off): no instability to measure
    result.projected_fail_step = projected_fail_step(record.probe_steps, record.probe_loss)
    components = compute_instability(
        probe_loss=record.probe_loss,
        probe_max_activation=record.probe_max_activation,
        skipped=[s in record.skipped for s in range(1, len(result.loss_trace) + 1)],
        steps=len(result.loss_trace),
        compute_dtype=config.bnb_4bit_compute_dtype,
        loss=result.loss_trace,
        grad_norm=result.grad_norm_trace,
    )
    result.instability = components.instability
    result.instability_components = {k: v for k, v in components.to_dict().items() if k != "instability"}
    return result


def _write_result(result: TrialResult, result_path: Path) -> None:
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), allow_nan=False))
    os.replace(tmp, result_path)


def _log_to(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so native libraries too) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def serve(control_fd: int) -> None:
    """Serve trials read as JSON lines on stdin until stdin closes or a trial leaves the process unfit for another
    (:attr:`WarmState.reusable`); after each, write its result file, then ``{"reusable": bool}`` and a newline on
    ``control_fd``. The heavy imports happen once, before the first job is read; the first trial's
    ``import_time_s`` and ``setup_time_s`` include them."""
    warm = WarmState()
    process_import_s = _import_heavy()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        _log_to(job["log_path"])
        os.environ["SWEEPER_TRIAL_DIR"] = job["trial_dir"]
        payload = json.loads(Path(job["config_path"]).read_text())
        result = run(TrialConfig.from_dict(payload["config"]), payload["model_path"], warm)
        if warm.trials == 1:
            result.import_time_s = process_import_s
            if result.setup_time_s is not None:
                result.setup_time_s += process_import_s
        _write_result(result, Path(job["result_path"]))
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(control_fd, (json.dumps({"reusable": warm.reusable}) + "\n").encode())
        if not warm.reusable:
            break


def main(argv: list[str]) -> int:
    """``python -m sweeper.trial._child.worker --serve`` (:func:`serve`, control pipe in ``SWEEPER_CONTROL_FD``) or
    ``... CONFIG.json RESULT.json`` (one trial); writes results atomically, exit 0 unless it could not."""
    # pyarrow (imported by datasets and the Trainer) reserves 1 GiB of virtual memory for mimalloc at import; under
    # RLIMIT_DATA that reservation would count as used. The system allocator reserves nothing (measured: VmData
    # 1.43 -> 0.46 GiB after importing transformers' Trainer).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    if argv[:1] == ["--serve"]:
        serve(int(os.environ["SWEEPER_CONTROL_FD"]))
    else:
        config_path, result_path = Path(argv[0]), Path(argv[1])
        payload = json.loads(config_path.read_text())
        os.environ.setdefault("SWEEPER_TRIAL_DIR", str(config_path.parent))
        _write_result(run(TrialConfig.from_dict(payload["config"]), payload["model_path"]), result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: it can take seconds after a large model and changes nothing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
