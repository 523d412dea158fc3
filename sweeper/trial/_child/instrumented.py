"""The trainer side of a trial's measurements (child process; imports torch and transformers): a
``transformers.Trainer`` (:class:`TracingTrainer`) that records each optimizer step's raw loss, pre-clip gradient
norm, supervised tokens and rows into a :class:`~sweeper.trial._child.record.TrainingRecord`, the callback
(:class:`TraceCallback`) that closes each step, runs the worst-case step once (:func:`run_worst_case_step`) and the
probe, and forward hooks that keep the largest activation of the 4-bit layers. Used by
:mod:`sweeper.trial._child.recipe` only, and imported with the heavy libraries
(:func:`sweeper.trial._child.worker.import_heavy`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from sweeper.stability import divergence, stress_lr
from sweeper.trial._child.collate import model_inputs, sample_indices
from sweeper.trial._child.line_search import run_line_search
from sweeper.trial._child.progress import ProgressSender
from sweeper.trial._child.record import (
    DivergedError,
    NonFiniteError,
    Probe,
    StressOverflow,
    TrainingRecord,
    finite_or_none,
)


class TracingTrainer(Trainer):
    """A ``Trainer`` that reads the data in order, records each micro-batch's rows, supervised tokens, loss and the
    step's pre-clip gradient norm into ``record``, and raises :class:`NonFiniteError` at the first non-finite value
    (an input id outside ``[0, vocab_size)`` before the forward; a loss; a gradient norm without an fp16 scaler).

    Args:
        record: Where the measurements go.
        vocab_size: Rows of the model's input embedding.
        *args, **kwargs: ``transformers.Trainer``'s.
    """

    def __init__(self, *args: Any, record: TrainingRecord, vocab_size: int, **kwargs: Any):
        self.record, self.vocab_size = record, vocab_size
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps, optimizer=None):
        """``constant_with_warmup`` (as ``Trainer`` builds it) for the constant phase; with a stress phase
        (``record.stress``), stress step ``j`` then runs at ``record.stress.growth**j`` times the learning rate."""
        stress = self.record.stress
        if stress is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        warmup, after, growth = self.args.warmup_steps, stress.after_step, stress.growth

        def factor(done: int) -> float:  # optimizer steps done before the one it sets the rate of
            if done < after:  # transformers' _get_constant_lambda_with_warmup, the same numbers
                return float(done) / float(max(1.0, warmup)) if done < warmup else 1.0
            return growth ** (done - after + 1)

        target = optimizer if optimizer is not None else self.optimizer
        assert target is not None  # Trainer creates the optimizer before the scheduler
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(target, factor)
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def _get_train_sampler(self, train_dataset=None):
        # The data is shuffled once with dataset.seed; every trial reads it in the same order.
        return torch.utils.data.SequentialSampler(
            train_dataset if train_dataset is not None else self.train_dataset  # type: ignore[arg-type]
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """``Trainer.compute_loss``, with the record's ``fail_phase`` ``forward`` during it and ``backward`` after."""
        self.record.fail_phase = "forward"
        out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        self.record.fail_phase = "backward"
        return out

    def training_step(self, model, inputs, num_items_in_batch=None):
        """``Trainer.training_step`` of one micro-batch, its rows, tokens (the data's and all processed) and loss
        recorded (the collator's bookkeeping keys removed)."""
        record = self.record
        index = sample_indices(inputs)
        data_tokens = int(inputs["sample_tokens"].sum())
        step_batch = {k: v.detach() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        inputs = model_inputs(inputs)
        # References, not copies: a step's batch is a few KB and stays alive for one step anyway; the NaN
        # diagnosis reads it only when a step fails.
        record.step_batches.append(step_batch)
        if not record.stressing:  # the trial's data attributes are the constant phase's
            record.seen.update(index)
        # Trainer's num_items_in_batch is the step's count of labels[..., 1:] != -100 over all micro-batches.
        supervised = int((step_batch["labels"][:, 1:] != -100).sum())
        record.step_supervised = (
            int(num_items_in_batch) if num_items_in_batch is not None else (record.step_supervised or 0) + supervised
        )
        ids = step_batch["input_ids"]
        if bool(((ids < 0) | (ids >= self.vocab_size)).any()):
            raise NonFiniteError(
                "input id", int(ids.max()) if int(ids.max()) >= self.vocab_size else int(ids.min()), "forward"
            )
        if not record.stressing:
            record.tokens += data_tokens
            record.processed_tokens += int(ids.numel())
        loss = super().training_step(model, inputs, num_items_in_batch)
        # The returned loss is this micro-batch's share of the step's mean loss; their sum is the step's loss.
        value = float(loss)
        record.step_loss += value
        if not math.isfinite(value):
            raise NonFiniteError("loss", value, "forward")
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self.record.fail_phase = "optimizer"
        self.record.step_grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        if not math.isfinite(self.record.step_grad_norm) and self.accelerator.scaler is None:
            raise NonFiniteError("gradient norm", self.record.step_grad_norm, "backward")
        return grad_norm


def update_to_weight_ratio(net: Any, record: TrainingRecord) -> float | None:
    """The LoRA update's Frobenius norm over the base weights', ``sqrt(sum ||s B A||^2) / sqrt(sum ||W||^2)`` over
    every adapted layer (``s`` its ``scaling``, ``B A`` its low-rank product); None when non-finite or no layer is
    adapted. ``||B A||_F^2 = sum((B^T B) * (A A^T))`` (r x r products, cheap at any width); the base weights are
    dequantized once per trial and their norm kept in ``record.base_weight_norm``."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in net.modules() if isinstance(m, LoraLayer)]
    if not layers:
        return None
    with torch.no_grad():
        if record.base_weight_norm is None:
            import bitsandbytes.functional as bnbf

            total = 0.0
            for m in layers:
                weight: Any = m.get_base_layer().weight
                state = getattr(weight, "quant_state", None)
                dense: Any = bnbf.dequantize_4bit(weight.data, state) if state is not None else weight
                total += float(dense.float().pow(2).sum())
            record.base_weight_norm = math.sqrt(total)
        update = 0.0
        for m in layers:
            for name, a in m.lora_A.items():
                A: Any = a.weight.float()
                B: Any = m.lora_B[name].weight.float()
                update += m.scaling[name] ** 2 * float(((B.T @ B) * (A @ A.T)).sum())
    ratio = math.sqrt(max(update, 0.0)) / record.base_weight_norm if record.base_weight_norm else None
    return ratio if ratio is not None and math.isfinite(ratio) else None


def run_probe(trainer: Any, record: TrainingRecord, probe: Probe, step: int) -> None:
    """The probe's mean loss over its supervised tokens (forwards without gradients, dropout off; its memory is the
    ``probe`` phase's, :class:`~sweeper.trial._child.memory.PhasePeaks`), recorded at ``step``; raises
    :class:`DivergedError` once :func:`sweeper.stability.divergence` says the run diverged.

    The model runs in training mode with only its dropout modules in eval mode, and every module's mode is
    restored afterwards: on a CPU with AVX512-BF16, bitsandbytes repacks a ``Linear4bit``'s weights for
    inference at its first forward outside training mode (``Linear4bit.forward``,
    ``_convert_weight_packed_for_cpu``), and training would go on with other kernels and other numbers.
    Measured on the built-in model: a probe in eval mode moved the loss of step 1 from 3.55 to 3.54 and made the
    run at learning rate 3e-3 diverge at step 24; this way the training trace is the same bit for bit as without
    a probe (``tests/sweep/test_confirm.py``).
    """
    start = time.monotonic()
    net: Any = trainer.model
    modes = [(m, m.training) for m in net.modules()]
    net.train()
    for m in net.modules():
        if isinstance(m, torch.nn.Dropout):
            m.eval()
    record.probing, record.probe_step_max_activation = True, None
    before = record.enter_memory_phase("probe")
    try:
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in probe.batches:
                batch = {k: v.to(trainer.args.device) for k, v in batch.items()}
                n = int((batch["labels"][..., 1:] != -100).sum())
                total += float(net(**batch).loss.float()) * n
                count += n
        value = total / count if count else float("nan")
    finally:
        record.probing = False
        for m, training in modes:
            m.train(training)
        if before is not None:
            record.enter_memory_phase(before)
    act = record.probe_step_max_activation
    stress = record.stress if record.stressing else None
    if stress is not None:  # the stress phase's probe: its own trace, read with the constant phase's before it
        stress.probe_loss.append(finite_or_none(value))
        steps = record.probe_steps + [stress.after_step + j for j in range(1, stress.done + 1)]
        found = divergence(steps, record.probe_loss + stress.probe_loss, final=stress.done >= stress.steps)
    else:
        record.probe_steps.append(step)
        record.probe_loss.append(finite_or_none(value))
        record.update_ratio.append(update_to_weight_ratio(net, record))
        record.probe_max_activation.append(None if act is None else finite_or_none(float(act)))
        record.probe_time_s += time.monotonic() - start
        found = divergence(record.probe_steps, record.probe_loss, final=step >= probe.max_steps)
    if found is not None:
        raise DivergedError(found)


def run_worst_case_step(trainer: Any, record: TrainingRecord) -> None:
    """One forward and backward of the data's worst step (``record.worst_case_batch``: the micro-batch of its longest
    rows, :func:`sweeper.trial._child.collate.worst_case_rows`), measured as the ``worst_case`` memory phase and then
    undone: its gradients are dropped before any optimizer step, the random number generators (dropout's) are
    restored, and nothing is recorded in the traces, so the trial trains exactly as it would without it. Run after
    step 1, once the optimizer's state exists, so that its peak holds everything a training step of that shape
    holds. Sets ``record.worst_case_shape`` (``(rows, tokens)``), ``record.worst_case_supervised_tokens`` (the
    tokens its loss was computed on) and ``record.worst_case_time_s`` (seconds, memory phase changes included: what
    the trial's ``train_time_s`` leaves out, as the step leaves out its training).

    Raises:
        Exception: What the step raises (an out-of-memory error under the cap: the configuration's OOM, with
            ``record.in_worst_case`` left True to name it).
    """
    batch = record.worst_case_batch
    if batch is None:
        return
    net: Any = trainer.model
    cuda = torch.cuda.is_available()
    rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if cuda else None)
    fail_phase = record.fail_phase
    record.in_worst_case = True
    start = time.monotonic()
    before = record.enter_memory_phase("worst_case")
    try:
        inputs = {k: v.to(trainer.args.device) for k, v in model_inputs(batch).items()}
        record.fail_phase = "forward"
        with trainer.compute_loss_context_manager():
            loss = net(**inputs).loss
        record.fail_phase = "backward"
        trainer.accelerator.backward(loss)
        del loss, inputs
        if record.peaks is not None:
            record.peaks.check_cap()  # an OOM at the worst-case step when its resident set passed the CPU cap
    finally:
        net.zero_grad(set_to_none=True)
        torch.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
        record.worst_case_time_s = time.monotonic() - start
    rows, tokens = batch["input_ids"].shape
    record.worst_case_shape = (int(rows), int(tokens))
    # what its loss was computed on (labels shift left by one: transformers' ForCausalLMLoss): 0 is a step of rows
    # whose replies lie past the cut, a NaN in a run that trains them alone (issue 68), not a silent 0 loss
    record.worst_case_supervised_tokens = int((batch["labels"][..., 1:] != -100).sum())
    record.fail_phase, record.in_worst_case = fail_phase, False
    if before is not None:
        record.enter_memory_phase(before)
    record.worst_case_time_s = time.monotonic() - start


class TraceCallback(TrainerCallback):
    """Opens and closes each optimizer step in ``record`` (the per-step traces, fp16 scaler skips, the step's rows
    kept as the last finite step's), raises :class:`NonFiniteError` for a non-finite gradient norm the scaler did not
    skip, and runs the probe before the first step and every ``probe.interval_steps`` steps (and at the last).

    With a stress phase (``record.stress``), the constant phase ends after step ``probe.max_steps`` and its last
    probe: ``on_constant_end`` is called, and each later step goes to the stress record with a probe after it
    (:class:`~sweeper.trial._child.record.StressOverflow` when the fp16 scaler skipped it, :class:`DivergedError`
    when the probe shows the divergence).

    Args:
        record: Where the measurements go.
        probe: The probe, or None for none.
        on_constant_end: Called once when the constant phase has ended and the stress phase begins.
        progress: Where each step's progress line goes (None: nowhere).

    Attributes:
        trainer: The trainer it reports on (set once the trainer exists; its accelerator tells a skipped step).
    """

    def __init__(
        self,
        record: TrainingRecord,
        probe: Probe | None,
        on_constant_end: Callable[[], None] | None = None,
        progress: ProgressSender | None = None,
    ):
        self.record, self.probe, self.on_constant_end = record, probe, on_constant_end
        self.progress = progress if progress is not None else ProgressSender(None)
        self.trainer: Any = None

    def on_train_begin(self, args, state, control, **kwargs):
        """Probe the untrained adapter (step 0), then say that training began (step 0 of the constant phase): with
        many micro-batches a step, the first step's own report can come minutes after the model finished loading."""
        if self.probe is not None:
            run_probe(self.trainer, self.record, self.probe, 0)
        record = self.record
        constant_steps = record.stress.after_step if record.stress is not None else args.max_steps
        self.progress.report("train", step=0, of=constant_steps)

    def on_step_begin(self, args, state, control, **kwargs):
        """Reset the step's values."""
        record = self.record
        record.step_loss = 0.0
        record.step_grad_norm = float("nan")
        record.step_max_activation = None
        record.step_batches = []
        record.step_supervised = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Run the line search (:func:`sweeper.trial._child.line_search.run_line_search`) before the update of a
        constant-phase step in ``record.line_search_steps``."""
        record = self.record
        step = state.global_step + 1
        if self.probe is not None and not record.stressing and step in record.line_search_steps:
            run_line_search(self.trainer, record, self.probe, step)

    def on_step_end(self, args, state, control, **kwargs):
        """Append the finished step's values to the traces; probe when due. A constant-phase step whose resident set
        passed the CPU cap raises :class:`~sweeper.trial._child.memory.CapExceeded` (an OOM at that step)."""
        record, probe = self.record, self.probe
        scaler = self.trainer.accelerator.scaler
        skipped = bool(scaler is not None and self.trainer.accelerator.optimizer_step_was_skipped)
        step = state.global_step
        if record.stressing:
            self._stress_step_end(skipped)
            stress = record.stress
            assert stress is not None
            self.progress.report("stress", step=stress.done, of=stress.steps, loss=record.step_loss)
            return
        if record.peaks is not None:
            record.peaks.check_cap()  # an OOM at this step when its resident set passed the CPU cap
        constant_steps = record.stress.after_step if record.stress is not None else args.max_steps
        self.progress.report("train", step=step, of=constant_steps, loss=record.step_loss)
        act = record.step_max_activation
        record.loss.append(finite_or_none(record.step_loss))
        record.grad_norm.append(finite_or_none(record.step_grad_norm))
        record.max_activation.append(None if act is None else finite_or_none(float(act)))
        if skipped:
            record.skipped.append(step)
        record.step = step
        record.supervised.append(record.step_supervised or 0)
        record.last_batches, record.step_batches = record.step_batches, []
        record.step_supervised = None
        if not math.isfinite(record.step_grad_norm) and not skipped:
            raise NonFiniteError("gradient norm", record.step_grad_norm, "backward")
        if step == 1:
            run_worst_case_step(self.trainer, record)
        if probe is not None and (step % probe.interval_steps == 0 or step >= probe.max_steps):
            run_probe(self.trainer, record, probe, step)
        if record.stress is not None and probe is not None and step >= probe.max_steps:
            record.stress.active = True
            if self.on_constant_end is not None:
                self.on_constant_end()
            record.stress.started = time.monotonic()

    def _stress_step_end(self, skipped: bool) -> None:
        """Record a finished stress step and probe after it; raises when it showed the edge."""
        record, stress = self.record, self.record.stress
        assert stress is not None and self.probe is not None
        stress.done += 1
        stress.lr.append(stress_lr(stress.learning_rate, stress.done, stress.growth))
        stress.loss.append(finite_or_none(record.step_loss))
        record.step_batches = []
        if skipped:
            raise StressOverflow(f"the fp16 loss scaler skipped stress step {stress.done}")
        if not math.isfinite(record.step_grad_norm):
            raise NonFiniteError("gradient norm", record.step_grad_norm, "backward")
        run_probe(self.trainer, record, self.probe, stress.after_step + stress.done)


def make_trainer(
    model: Any,
    args: Any,
    rows: list[dict],
    collate: Any,
    record: TrainingRecord,
    probe: Probe | None = None,
    on_constant_end: Callable[[], None] | None = None,
    progress: ProgressSender | None = None,
) -> TracingTrainer:
    """A :class:`TracingTrainer` with its :class:`TraceCallback`: it records every optimizer step's raw loss, pre-clip
    gradient norm and supervised tokens, keeps the step's rows, and raises :class:`NonFiniteError` at the first
    non-finite value, before the optimizer applies it (so the weights stay those the step failed on; with an fp16 loss
    scaler, a skipped step is not a failure). With a ``probe``, it evaluates the probe before the first step and
    every ``probe.interval_steps`` steps, and raises :class:`DivergedError` once :func:`sweeper.stability.divergence`
    says the run diverged. With ``record.stress`` (which needs a probe), ``args.max_steps`` includes the stress steps
    and ``on_constant_end`` is called when the constant phase ends (:class:`TraceCallback`). Each step's progress
    line goes to ``progress``."""
    callback = TraceCallback(record, probe, on_constant_end, progress)
    trainer = TracingTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=collate,
        callbacks=[callback],
        record=record,
        vocab_size=model.get_input_embeddings().num_embeddings,
    )
    callback.trainer = trainer
    return trainer


def track_activations(model: Any, record: TrainingRecord) -> list[Any]:
    """Forward hooks on every ``bitsandbytes.nn.Linear4bit`` keeping the step's largest |input| and |output|.

    Those are the tensors that exist in the compute dtype: bitsandbytes casts the layer's input to it, runs the
    matmul in it and casts the result back (peft's LoRA branch and the residual stream stay in float32). The running
    maximum stays on the device and is read once per step.

    Returns:
        The hooks' handles: a warm trial process removes them before it keeps the model for the next trial.
    """
    import bitsandbytes as bnb

    def hook(_module, inputs, output):
        tensors = [t for t in (*inputs, output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for t in tensors:
            peak = t.detach().abs().amax().float()
            if record.in_worst_case or record.in_line_search:
                continue
            if record.probing:
                cur = record.probe_step_max_activation
                record.probe_step_max_activation = peak if cur is None else torch.maximum(cur, peak)
                continue
            cur = record.step_max_activation
            record.step_max_activation = peak if cur is None else torch.maximum(cur, peak)

    return [module.register_forward_hook(hook) for module in model.modules() if isinstance(module, bnb.nn.Linear4bit)]
