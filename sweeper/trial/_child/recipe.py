"""The trial's recipe (child side), in torchtune's shape: :func:`setup` builds everything a run needs (tokenizer and
rows, the 4-bit base model loaded or reused, checked, prepared and adapted with LoRA, the instrumented trainer), then
:func:`train` runs it, diagnoses a NaN on the weights it failed on, and hands the base model back to the warm state
when the process may reuse it. Imported with the heavy libraries (:func:`sweeper.trial._child.worker.import_heavy`);
exceptions propagate to :func:`sweeper.trial._child.worker.run`.
"""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sweeper.space import TrialConfig
from sweeper.trial._child.checks import check_block_diagonal, check_lora_targets, check_quantization
from sweeper.trial._child.collate import make_collator, pack_rows
from sweeper.trial._child.context import TrialContext
from sweeper.trial._child.diagnosis import NanDiagnosis, diagnose_nan
from sweeper.trial._child.instrumented import make_trainer
from sweeper.trial._child.instruments import Arming, make_instruments, track_activations
from sweeper.trial._child.instruments.phase_memory import PhaseMemory
from sweeper.trial._child.instruments.stress import Stress
from sweeper.trial._child.load import load_model
from sweeper.trial._child.measurements import Measurements
from sweeper.trial._child.memory import peak_memory_gib, set_cuda_allocator, set_cuda_memory_cap
from sweeper.trial._child.record import DivergedError, NonFiniteError, TrainingRecord
from sweeper.trial._child.warm import WarmState, model_key, release_memory, restore_base


@dataclass
class Run:
    """What :func:`setup` built for one trial.

    Attributes:
        trainer: The instrumented ``Trainer`` (:func:`sweeper.trial._child.instrumented.make_trainer`).
        tokenizer: The trial's tokenizer.
        hooks: The activation hooks' handles (taken off before the base model is kept).
        key: The base model's :func:`~sweeper.trial._child.warm.model_key`.
        samples: The dataset's samples by index (for ``nan_batch.jsonl``).
        n_tokens: Tokens before truncation by sample index.
    """

    trainer: Any
    tokenizer: Any
    hooks: list[Any]
    key: tuple[Any, ...]
    samples: dict[int, Any]
    n_tokens: dict[int, int]


def _training_arguments(config: TrialConfig, trial_dir: Path, cuda: bool, stress_steps: int = 0) -> Any:
    """The ``TrainingArguments`` of a trial: ``max_steps`` at a constant learning rate after warmup (then
    ``stress_steps`` more, whose rates :meth:`TracingTrainer.create_scheduler` sets), no saving, no logging, the
    trainer's files under ``trial_dir/trainer``."""
    from transformers import TrainingArguments

    # transformers 5.23 renamed gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs); the old names
    # warn there (removed in v6), and releases before 5.23 know only them.
    checkpointing = "activation_checkpointing"
    if checkpointing not in TrainingArguments.__dataclass_fields__:
        checkpointing = "gradient_checkpointing"
    shared = config.training_arguments()  # the keys the export writes too (one mapping: TrialConfig)
    shared[f"{checkpointing}_kwargs"] = {"use_reentrant": False}
    shared[checkpointing] = shared.pop("gradient_checkpointing")
    return TrainingArguments(
        output_dir=str(trial_dir / "trainer"),
        max_steps=config.max_steps + stress_steps,
        # Constant after warmup: a short run should probe the peak learning rate a long run spends most steps at,
        # not a rate already decayed toward 0.
        lr_scheduler_type="constant_with_warmup",
        **shared,
        use_cpu=not cuda,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )


def _adapted_model(
    config: TrialConfig, model_path: str, key: tuple[Any, ...], cuda: bool, warm: WarmState, measured: Measurements
) -> Any:
    """The trial's 4-bit base model (the kept one when its key matches, else loaded), checked, prepared for k-bit
    training and wrapped in a peft LoRA adapter whose targets are checked."""
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model = warm.take_model(config, key)
    measured.model_reused = model is not None
    if model is None:
        model = load_model(config, model_path, cuda)
    measured.quantized_linear_count = check_quantization(model, config)
    # Training never reads a KV cache (the QLoRA recipe turns it off too); with one, transformers builds no
    # block-diagonal mask for packed rows (masking_utils: only without a cache) and the probe's forward keeps every
    # layer's keys and values.
    model.config.use_cache = False
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
    return model


def _tokenized(config: TrialConfig, model_path: str, warm: WarmState) -> tuple[Any, list[Any], list[Any]]:
    """The tokenizer, the samples and their tokenization at ``config.max_seq_length``; the tokenizer and the samples
    kept in ``warm`` for the next trial of this process that reads the
    same model and dataset."""
    from sweeper.data import load_samples, load_tokenizer, tokenize_samples

    tokenizer_key = (model_path, config.model.trust_remote_code)
    if tokenizer_key not in warm.tokenizers:
        warm.tokenizers[tokenizer_key] = load_tokenizer(model_path, config.model.trust_remote_code)
    tokenizer = warm.tokenizers[tokenizer_key]
    dataset_key = json.dumps(config.to_dict()["dataset"], sort_keys=True, default=str)
    if warm.samples is None or warm.samples[0] != dataset_key:
        warm.samples = (dataset_key, load_samples(config.dataset))
    samples = warm.samples[1]
    return tokenizer, samples, tokenize_samples(samples, tokenizer, config.max_seq_length)


def setup(trial: TrialContext) -> Run:
    """Read the data, load (or reuse), check and adapt the model, arm the instruments the job wants
    (``trial.instruments``, made first, so that a trial that fails while loading still writes what they hold) and
    build the trainer; sets ``trial.measured``'s ``device``, ``model_reused``, ``quantized_linear_count``,
    ``load_time_s`` and ``load_peak_memory_gib``.

    Raises:
        SetupCheckError: The model is not quantized or adapted as asked, or packed samples see each other.
        Exception: What loading raises (an out-of-memory error under the cap among them).
    """
    config, model_path, warm, record, measured = (
        trial.config,
        trial.model_path,
        trial.warm,
        trial.record,
        trial.measured,
    )
    trial.instruments = make_instruments(trial.measures)
    t_load = time.monotonic()
    cuda = torch.cuda.is_available()
    if cuda:
        set_cuda_allocator(config.expandable_segments)
        set_cuda_memory_cap(config.memory_limit_gib)
    measured.device = f"cuda:0 ({torch.cuda.get_device_name(0)})" if cuda else "cpu"
    tokenizer, samples, tokenized = _tokenized(config, model_path, warm)
    rows = [{"input_ids": t.input_ids, "labels": t.labels, "index": t.index} for t in tokenized]
    key = model_key(config, model_path)
    model = _adapted_model(config, model_path, key, cuda, warm, measured)
    hooks = track_activations(model, record) if config.bnb_4bit_compute_dtype != "float32" else []
    collate = make_collator(tokenizer.pad_token_id, config.packing)
    unpacked = rows
    if config.packing:
        rows = pack_rows(rows, config.max_seq_length)
        check_block_diagonal(model, rows, collate)  # the packed samples kept apart, or the trial fails (issue 55)
    arming = Arming(trial, rows, unpacked, collate, tokenizer)
    added_steps = 0
    for instrument in trial.instruments:
        added_steps += instrument.arm(arming)
        arming.armed[instrument.name] = instrument
    args = _training_arguments(config, trial.trial_dir, cuda, added_steps)
    trainer = make_trainer(model, args, rows, collate, record, trial.instruments)
    measured.load_time_s = time.monotonic() - t_load
    measured.load_peak_memory_gib = peak_memory_gib("cuda" if cuda else "cpu")
    for instrument in trial.instruments:
        if isinstance(instrument, PhaseMemory):
            instrument.start("cuda" if cuda else "cpu", measured.load_peak_memory_gib)
    trial.progress.peaks = record.peaks
    return Run(
        trainer=trainer,
        tokenizer=tokenizer,
        hooks=hooks,
        key=key,
        samples={s.index: s for s in samples},
        n_tokens={t.index: t.n_tokens for t in tokenized},
    )


def train(run: Run, trial: TrialContext) -> None:
    """Train ``run`` for ``config.max_steps`` optimizer steps, then its stress phase when one is armed (its end,
    whatever ended it, is recorded by :meth:`~sweeper.trial._child.instruments.stress.Stress.end`, never raised);
    sets ``trial.measured``'s ``train_start``, ``train_time_s`` (the constant phase's) and the seen-sample lengths.
    After a NaN in the constant phase, diagnoses it on the weights it failed on (the diagnosis goes on the
    :class:`NonFiniteError`) and writes ``nan_batch.jsonl`` into ``trial_dir``. After ``complete`` or ``diverged``,
    keeps the restored base model in ``trial.warm`` for the next trial (not after a stress phase that ran out of
    memory); ``run.trainer`` is None afterwards either way.

    Raises:
        NonFiniteError, DivergedError: Training stopped early.
        Exception: What training raises (an out-of-memory error under the cap among them).
    """
    config, record, measured, warm = trial.config, trial.record, trial.measured, trial.warm
    stress = next((i for i in trial.instruments if isinstance(i, Stress)), None)
    if not torch.cuda.is_available():
        # See sweeper.trial._child.memory: on the CPU the training-phase peak stands for the card. What loading freed
        # is handed back first, so the peak starts from what the process holds, not from when glibc last trimmed.
        release_memory()
    record.enter_memory_phase("train")
    t_train = measured.train_start = time.monotonic()
    record.fail_phase = "forward"
    kept = False
    try:
        run.trainer.train()
        kept = True
        if stress is not None and record.stressing:
            kept = stress.end(None)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if not record.stressing:
            kept = isinstance(exc, DivergedError)
            if isinstance(exc, NonFiniteError):
                _on_nan(exc, run, config, record, measured, trial.trial_dir, t_train)
            raise
        assert stress is not None
        kept = stress.end(exc)  # the constant phase completed: the edge is a measurement, not a failure
    finally:
        if record.peaks is not None:
            record.peaks.close()
        if measured.train_time_s is None:
            measured.train_time_s = time.monotonic() - t_train
        measured.add_seen_lengths(record, run.n_tokens, config.max_seq_length)
        trainer, run.trainer = run.trainer, None
        if kept:  # the next trial of this process may reuse the base model
            peft_model = trainer.model
            trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
            del trainer
            warm.model = restore_base(peft_model, run.hooks)
            warm.model_key = run.key if warm.model is not None else None
            del peft_model
        else:
            del trainer


def _on_nan(
    exc: NonFiniteError,
    run: Run,
    config: TrialConfig,
    record: TrainingRecord,
    measured: Measurements,
    trial_dir: Path,
    t_train: float,
) -> None:
    """After a NaN in the constant phase: its training time, the diagnosis (on the :class:`NonFiniteError`) and
    ``nan_batch.jsonl``."""
    measured.train_time_s = time.monotonic() - t_train
    try:
        exc.diagnosis = _diagnose(exc, run.trainer, config, record, run.tokenizer)
        _write_nan_batch(exc.diagnosis, run.tokenizer, run.samples, record.step + 1, trial_dir)
    except Exception:
        traceback.print_exc()


def _diagnose(
    exc: NonFiniteError, trainer: Any, config: TrialConfig, record: TrainingRecord, tokenizer: Any
) -> NanDiagnosis:
    """Why the step failed (:func:`sweeper.trial._child.diagnosis.diagnose_nan`), on the weights it failed on."""
    model = trainer.model
    model.zero_grad(set_to_none=True)  # the failed step's gradients: memory the replay may need
    gc.collect()
    return diagnose_nan(
        model,
        config,
        record,
        failed_in=exc.what,  # type: ignore[arg-type]
        precision=trainer.compute_loss_context_manager,
        tokenizer=tokenizer,
    )


def _write_nan_batch(
    diagnosis: NanDiagnosis, tokenizer: Any, samples: dict[int, Any], step: int, trial_dir: Path
) -> None:
    """The failing step's rows as ``nan_batch.jsonl`` in ``trial_dir``, one JSON object per row (docs/trial.md, "What a
    trial is and records"): ``step``, ``index``, ``tokens_trained``, ``tokens_before_truncation``, ``truncated``,
    ``micro_batch``, ``supervised_tokens``, ``invalid_token_ids``, ``nonfinite_inputs``, ``fp32_loss``,
    ``fp32_finite``, ``at_fault``, ``text`` (decoded as trained) and ``text_cut_away`` (what truncation removed)."""
    from sweeper.data import audit_horizon, tokenize_samples

    lines = []
    for row in diagnosis.rows:
        record = {"step": step, **row.to_dict()}
        sample = samples.get(row.index)
        # up to the audit's horizon: a huge row's cut-away text is not tokenized (or written) whole
        horizon = audit_horizon([len(row.input_ids)])
        full = tokenize_samples([sample], tokenizer, horizon)[0].input_ids if sample is not None else []
        cut = full[len(row.input_ids) :]
        record.update(
            tokens_before_truncation=len(full) or None,
            truncated=bool(cut),
            text=tokenizer.decode(row.input_ids, skip_special_tokens=False),
            text_cut_away=tokenizer.decode(cut, skip_special_tokens=False),
        )
        lines.append(json.dumps(record, ensure_ascii=False))
    tmp = trial_dir / "nan_batch.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, trial_dir / "nan_batch.jsonl")
