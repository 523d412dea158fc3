"""The child side of a trial: the only place that trains.

``python -m sweeper._worker CONFIG.json RESULT.json`` caps its own memory, loads the model in 4 bits with
bitsandbytes, checks the quantization took effect, attaches a peft LoRA adapter, trains ``max_steps`` optimizer steps
with ``transformers.Trainer`` while recording the raw loss, the pre-clip gradient norm, fp16 scaler skips and the
largest activation of every step, and writes a :class:`~sweeper.trial.TrialResult` as JSON. It stops at the first
non-finite loss or gradient norm (``nan``) and turns a real allocation failure into ``oom``, naming the phase.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from sweeper.memory import mentions_oom, oom_cause_chain, peak_memory_gib, reset_cpu_peak, set_cpu_memory_cap
from sweeper.space import TrialConfig
from sweeper.stability import compute_instability
from sweeper.trial import TrialResult

#: Kept allocated while the trial runs and released after an OOM, so the result can still be written under the cap.
_RESERVE_BYTES = 32 * 2**20


class NonFiniteError(Exception):
    """The loss or gradient norm of a step is NaN or infinite."""

    def __init__(self, what: str, value: float, phase: str):
        self.what, self.value, self.phase = what, value, phase
        super().__init__(f"{what} is {value}")


class QuantizationCheckError(Exception):
    """The loaded model is not quantized as the trial asked."""


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


class _Progress:
    """Mutable state shared by the trainer hooks and the error handler."""

    def __init__(self) -> None:
        self.phase = "load"
        self.step = 0  # optimizer steps finished
        self.loss: list[float | None] = []
        self.grad_norm: list[float | None] = []
        self.max_activation: list[float | None] = []
        self.skipped: list[int] = []
        self.tokens = 0
        self.step_loss = 0.0
        self.step_grad_norm = float("nan")
        self.step_max_activation: Any = None


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


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


def _collator(pad_id: int, max_seq_length: int):
    """Pad every row to ``max_seq_length`` (right), so each step runs at the worst-case shape ``[b, max_seq_length]``."""
    import torch

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        b = len(rows)
        input_ids = torch.full((b, max_seq_length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((b, max_seq_length), dtype=torch.long)
        labels = torch.full((b, max_seq_length), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.tensor(row["input_ids"])
            attention_mask[i, :n] = 1
            labels[i, :n] = torch.tensor(row["labels"])
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    return collate


def _make_trainer(model: Any, args: Any, rows: list[dict], collate: Any, progress: _Progress) -> Any:
    """A ``Trainer`` that records every optimizer step's raw loss and pre-clip gradient norm, and raises
    :class:`NonFiniteError` at the first non-finite one."""
    import torch
    from transformers import Trainer, TrainerCallback

    class TracingTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            # The data is shuffled once with dataset.seed; every trial reads it in the same order.
            return torch.utils.data.SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            progress.phase = "forward"
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            progress.phase = "backward"
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            progress.tokens += int(inputs["attention_mask"].sum())
            loss = super().training_step(model, inputs, num_items_in_batch)
            # The returned loss is this micro-batch's share of the step's mean loss; their sum is the step's loss.
            value = float(loss)
            progress.step_loss += value
            if not math.isfinite(value):
                raise NonFiniteError("loss", value, "forward")
            return loss

        def _get_grad_norm(self, model, grad_norm=None):
            grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
            progress.phase = "optimizer"
            progress.step_grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            return grad_norm

    class TraceCallback(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            progress.step_loss = 0.0
            progress.step_grad_norm = float("nan")
            progress.step_max_activation = None

        def on_step_end(self, args, state, control, **kwargs):
            scaler = trainer.accelerator.scaler
            skipped = bool(scaler is not None and trainer.accelerator.optimizer_step_was_skipped)
            step = state.global_step
            act = progress.step_max_activation
            progress.loss.append(_finite_or_none(progress.step_loss))
            progress.grad_norm.append(_finite_or_none(progress.step_grad_norm))
            progress.max_activation.append(None if act is None else float(act))
            if skipped:
                progress.skipped.append(step)
            progress.step = step
            if not math.isfinite(progress.step_grad_norm) and not skipped:
                raise NonFiniteError("gradient norm", progress.step_grad_norm, "backward")

    trainer = TracingTrainer(model=model, args=args, train_dataset=rows, data_collator=collate,
                             callbacks=[TraceCallback()])
    return trainer


def _track_activations(model: Any, progress: _Progress) -> None:
    """Forward hooks on every ``bitsandbytes.nn.Linear4bit`` keeping the step's largest |input| and |output|.

    Those are the tensors that exist in the compute dtype: bitsandbytes casts the layer's input to it, runs the
    matmul in it and casts the result back (peft's LoRA branch and the residual stream stay in float32). The running
    maximum stays on the device and is read once per step.
    """
    import bitsandbytes as bnb
    import torch

    def hook(_module, inputs, output):
        tensors = [t for t in (*inputs, output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for t in tensors:
            peak = t.detach().abs().amax().float()
            cur = progress.step_max_activation
            progress.step_max_activation = peak if cur is None else torch.maximum(cur, peak)

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.register_forward_hook(hook)


def train(config: TrialConfig, model_path: str, progress: _Progress, measured: dict[str, Any]) -> None:
    """Load, check, adapt and train, writing measurements (named as :class:`TrialResult` fields) into ``measured``
    as they become known. Exceptions propagate to :func:`run`."""
    t_import = time.monotonic()
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainingArguments

    from sweeper.data import load_samples, tokenize_samples

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    report_logger = logging.getLogger("transformers.utils.loading_report")
    report_logger.setLevel(logging.WARNING)
    report_logger.addHandler(_LOAD_REPORT)
    measured["import_time_s"] = time.monotonic() - t_import

    t_load = time.monotonic()
    cuda = torch.cuda.is_available()
    if cuda:
        from sweeper.memory import set_cuda_memory_cap

        set_cuda_memory_cap(config.memory_limit_gib)
    measured["device"] = f"cuda:0 ({torch.cuda.get_device_name(0)})" if cuda else "cpu"

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    samples = load_samples(config.dataset)
    tokenized = tokenize_samples(samples, tokenizer, config.max_seq_length)
    rows = [{"input_ids": t.input_ids, "labels": t.labels, "index": t.index} for t in tokenized]

    compute_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=config.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=config.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_path,
        quantization_config=quantization,
        dtype=compute_dtype,  # unquantized layers load in the compute dtype; peft upcasts them to fp32 below
        attn_implementation=config.model.attn_implementation,
        trust_remote_code=config.model.trust_remote_code,
        device_map={"": 0} if cuda else None,
    )
    measured["quantized_linear_count"] = check_quantization(model, config)
    model = prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    transformers.set_seed(config.seed)
    model = get_peft_model(model, LoraConfig(
        r=config.r,
        lora_alpha=config.lora_alpha,
        target_modules=list(config.target_modules),
        lora_dropout=config.lora_dropout,
        bias="none",
        task_type="CAUSAL_LM",
    ))
    if config.bnb_4bit_compute_dtype != "float32":
        _track_activations(model, progress)

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
        activation_checkpointing=config.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False},
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
    trainer = _make_trainer(model, args, rows, _collator(tokenizer.pad_token_id, config.max_seq_length), progress)
    measured["load_time_s"] = time.monotonic() - t_load
    measured["load_peak_memory_gib"] = peak_memory_gib("cuda" if cuda else "cpu")
    if not cuda:
        reset_cpu_peak()  # see sweeper.memory: on the CPU the training-phase peak stands for the card

    t_train = time.monotonic()
    progress.phase = "forward"
    try:
        trainer.train()
    finally:
        measured["train_time_s"] = time.monotonic() - t_train


def run(config: TrialConfig, model_path: str) -> TrialResult:
    """Run one trial in this process and return its result; never raises for a trial's own failure."""
    reserve = bytearray(_RESERVE_BYTES)
    if not _cuda_visible():
        set_cpu_memory_cap(config.memory_limit_gib)
    progress = _Progress()
    measured: dict[str, Any] = {}
    result = TrialResult(status="complete", lora_alpha=config.lora_alpha,
                         effective_batch_size=config.effective_batch_size)
    try:
        train(config, model_path, progress, measured)
        result.reason = f"{progress.step} steps finished"
    except NonFiniteError as exc:
        result.status, result.fail_phase = "nan", exc.phase
        result.fail_step = progress.step + 1
        result.reason = f"{exc.what} is {exc.value} at step {result.fail_step} ({exc.phase})"
    except QuantizationCheckError as exc:
        result.status, result.reason = "error", f"4-bit quantization check failed: {exc}"
        result.fail_phase, result.fail_step = "load", 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result; the parent decides
        reserve = None  # after an OOM, room to build and write the result under the cap
        gc.collect()
        result.fail_phase = progress.phase
        result.fail_step = 0 if progress.phase == "load" else progress.step + 1
        where = "while loading" if progress.phase == "load" else f"at step {result.fail_step} ({progress.phase})"
        if oom_cause_chain(exc) is not None or (progress.phase == "load" and _LOAD_REPORT.mentions_oom()):
            result.status = "oom"
            result.reason = (f"out of memory {where} under memory_limit_gib={config.memory_limit_gib:g}, "
                             f"max_seq_length={config.max_seq_length}, "
                             f"per_device_train_batch_size={config.per_device_train_batch_size}")
        else:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            result.status = "error"
            result.reason = f"{type(exc).__name__} {where}" + (f": {first}" if first else "")
            traceback.print_exc()
    del reserve
    gc.collect()
    torch = sys.modules.get("torch")
    device_type = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    result.peak_memory_gib = peak_memory_gib(device_type)
    result.memory_kind = "cuda_max_reserved" if device_type == "cuda" else "cpu_peak_rss"
    result.device = device_type
    if torch is not None:
        result.versions = _versions()
    result.steps_done = progress.step
    result.loss_trace, result.grad_norm_trace = progress.loss, progress.grad_norm
    result.max_activation_trace, result.skipped_steps = progress.max_activation, progress.skipped
    if result.status == "nan":  # the failing step's values, for the curves
        result.loss_trace = progress.loss + [_finite_or_none(progress.step_loss)]
        result.grad_norm_trace = progress.grad_norm + [_finite_or_none(progress.step_grad_norm)]
    for key, value in measured.items():
        setattr(result, key, value)
    if measured.get("train_time_s"):
        result.tokens_per_s = progress.tokens / measured["train_time_s"]
    if result.status not in ("complete", "nan"):
        return result  # too few steps for the instability terms to mean anything
    components = compute_instability(
        loss=result.loss_trace,
        grad_norm=result.grad_norm_trace,
        skipped=[s in progress.skipped for s in range(1, len(result.loss_trace) + 1)],
        max_activation=result.max_activation_trace,
        compute_dtype=config.bnb_4bit_compute_dtype,
    )
    result.instability = components.instability
    result.instability_components = {k: v for k, v in components.to_dict().items() if k != "instability"}
    return result


def _cuda_visible() -> bool:
    """Whether a CUDA device may be used, decided without importing torch (the CPU cap must be set before)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


def main(argv: list[str]) -> int:
    """``python -m sweeper._worker CONFIG.json RESULT.json``; writes the result atomically, exit 0 unless it
    could not."""
    config_path, result_path = Path(argv[0]), Path(argv[1])
    # pyarrow (imported by datasets and the Trainer) reserves 1 GiB of virtual memory for mimalloc at import; under
    # RLIMIT_DATA that reservation would count as used. The system allocator reserves nothing (measured: VmData
    # 1.43 -> 0.46 GiB after importing transformers' Trainer).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    payload = json.loads(config_path.read_text())
    os.environ.setdefault("SWEEPER_TRIAL_DIR", str(config_path.parent))
    result = run(TrialConfig.from_dict(payload["config"]), payload["model_path"])
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), allow_nan=False))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: it can take seconds after a large model and changes nothing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
