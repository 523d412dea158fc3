"""The trainer side of a trial's measurements (child process): the per-step state, the collator that pads every row
to ``max_seq_length`` and carries the rows' dataset indices, a ``transformers.Trainer`` that records each optimizer
step's raw loss, pre-clip gradient norm, supervised tokens and rows, and forward hooks that keep the largest
activation of the 4-bit layers. Used by :mod:`sweeper.trial._child.worker` only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from sweeper.stability import Divergence, divergence


class NonFiniteError(Exception):
    """The loss or gradient norm of a step is NaN or infinite, or an input id has no embedding row (which would be
    an index error on the CPU and a device-side assert on CUDA, so it is stopped before the forward).

    Attributes:
        what: ``loss``, ``gradient norm`` or ``input id``.
        value: The offending value.
        phase: ``forward`` or ``backward``.
        diagnosis: Set by :func:`train` once :func:`sweeper.trial._child.diagnosis.diagnose_nan` has run.
    """

    def __init__(self, what: str, value: float, phase: str):
        self.what, self.value, self.phase = what, value, phase
        self.diagnosis: Any = None
        super().__init__(f"{what} is {value}")

    def describe(self, step: int) -> str:
        """``loss is nan at step 3 (forward)``."""
        if self.what == "input id":
            return f"input id {self.value:g} has no embedding row at step {step} ({self.phase})"
        return f"{self.what} is {self.value} at step {step} ({self.phase})"


class TrainingRecord:
    """What the instrumented Trainer records of one trial, step by step (not a progress display): the phase being run,
    optimizer steps finished, per-step traces (raw loss, pre-clip gradient norm, largest 4-bit activation, supervised
    tokens), fp16 scaler skips, and the micro-batches of the current and last step for the NaN diagnosis. Shared by
    the trainer hooks and the error handler of :mod:`sweeper.trial._child.worker`."""

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
        # For NaN diagnosis and the data attributes: the current and the last finished step's micro-batches (CPU
        # copies, with their dataset indices), supervised tokens per step, and every sample index trained on.
        self.step_batches: list[dict[str, Any]] = []
        self.last_batches: list[dict[str, Any]] = []
        self.supervised: list[int] = []
        self.step_supervised: int | None = None
        self.seen: set[int] = set()
        # The probe (sweeper.stability): its steps, losses and largest 4-bit activations, and the seconds it took.
        self.probing = False
        self.probe_steps: list[int] = []
        self.probe_loss: list[float | None] = []
        self.probe_max_activation: list[float | None] = []
        self.probe_step_max_activation: Any = None
        self.probe_time_s = 0.0


class DivergedError(Exception):
    """The probe loss rose to :data:`sweeper.stability.DIVERGED_RATIO` times its start and stayed there.

    Attributes:
        divergence: The step and the evidence.
    """

    def __init__(self, found: Divergence):
        self.divergence = found
        super().__init__(found.reason)


@dataclass(frozen=True)
class Probe:
    """The fixed batch the trial evaluates without an update (see :mod:`sweeper.stability`).

    Attributes:
        batch: The probe rows collated as training collates them (``input_ids``, ``attention_mask``, ``labels``:
            ``[PROBE_ROWS, max_seq_length]``), evaluated in one forward without gradients: each forward dequantizes
            every 4-bit weight once, which at short lengths costs more than the rows themselves. Without the tensors
            saved for backward, the forward of two rows needs no more memory than a training step of one.
        interval_steps: Optimizer steps between probes (:func:`sweeper.stability.probe_interval_steps`).
        max_steps: The run's last step, which is always probed.
    """

    batch: dict[str, Any]
    interval_steps: int
    max_steps: int


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def make_collator(pad_id: int, max_seq_length: int):
    """Pad every row to ``max_seq_length`` (right), so each step runs at the worst-case shape ``[b, max_seq_length]``;
    ``sample_index`` (``[b]``) carries the rows' dataset indices to the trainer, which removes it before the model."""
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
        sample_index = torch.tensor([row["index"] for row in rows], dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "sample_index": sample_index,
        }

    return collate


def make_trainer(
    model: Any, args: Any, rows: list[dict], collate: Any, record: TrainingRecord, probe: Probe | None = None
) -> Any:
    """A ``Trainer`` that records every optimizer step's raw loss, pre-clip gradient norm and supervised tokens, keeps
    the step's rows, and raises :class:`NonFiniteError` at the first non-finite value, before the optimizer applies
    it (so the weights stay those the step failed on; with an fp16 loss scaler, a skipped step is not a failure).
    With a ``probe``, it evaluates the probe before the first step and every ``probe.interval_steps`` steps, and
    raises :class:`DivergedError` once :func:`sweeper.stability.divergence` says the run diverged."""
    import torch
    from transformers import Trainer, TrainerCallback

    vocab_size = model.get_input_embeddings().num_embeddings

    class TracingTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            # The data is shuffled once with dataset.seed; every trial reads it in the same order.
            return torch.utils.data.SequentialSampler(
                train_dataset if train_dataset is not None else self.train_dataset  # type: ignore[arg-type]
            )

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            record.phase = "forward"
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            record.phase = "backward"
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            index = inputs.pop("sample_index").tolist()
            # References, not copies: a step's batch is a few KB and stays alive for one step anyway; the NaN
            # diagnosis reads it only when a step fails.
            kept = {k: v.detach() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            record.step_batches.append({**kept, "sample_index": index})
            record.seen.update(index)
            # Trainer's num_items_in_batch is the step's count of labels[..., 1:] != -100 over all micro-batches.
            supervised = int((kept["labels"][:, 1:] != -100).sum())
            record.step_supervised = (
                int(num_items_in_batch)
                if num_items_in_batch is not None
                else (record.step_supervised or 0) + supervised
            )
            ids = kept["input_ids"]
            if bool(((ids < 0) | (ids >= vocab_size)).any()):
                raise NonFiniteError(
                    "input id", int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min()), "forward"
                )
            record.tokens += int(inputs["attention_mask"].sum())
            loss = super().training_step(model, inputs, num_items_in_batch)
            # The returned loss is this micro-batch's share of the step's mean loss; their sum is the step's loss.
            value = float(loss)
            record.step_loss += value
            if not math.isfinite(value):
                raise NonFiniteError("loss", value, "forward")
            return loss

        def _get_grad_norm(self, model, grad_norm=None):
            grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
            record.phase = "optimizer"
            record.step_grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            if not math.isfinite(record.step_grad_norm) and self.accelerator.scaler is None:
                raise NonFiniteError("gradient norm", record.step_grad_norm, "backward")
            return grad_norm

    def run_probe(step: int) -> None:
        """The probe's mean loss over its supervised tokens (one forward without gradients, dropout off).

        The model runs in training mode with only its dropout modules in eval mode, and every module's mode is
        restored afterwards: on a CPU with AVX512-BF16, bitsandbytes repacks a ``Linear4bit``'s weights for
        inference at its first forward outside training mode (``Linear4bit.forward``,
        ``_convert_weight_packed_for_cpu``), and training would go on with other kernels and other numbers.
        Measured on the built-in model: a probe in eval mode moved the loss of step 1 from 3.55 to 3.54 and made the
        run at learning rate 3e-3 diverge at step 24; this way the training trace is the same bit for bit as without
        a probe (``tests/test_confirm.py``).
        """
        assert probe is not None
        start = time.monotonic()
        net: Any = trainer.model
        modes = [(m, m.training) for m in net.modules()]
        net.train()
        for m in net.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
        record.probing, record.probe_step_max_activation = True, None
        try:
            with torch.no_grad():
                batch = {k: v.to(trainer.args.device) for k, v in probe.batch.items()}
                value = float(net(**batch).loss.float())
        finally:
            record.probing = False
            for m, training in modes:
                m.train(training)
        act = record.probe_step_max_activation
        record.probe_steps.append(step)
        record.probe_loss.append(finite_or_none(value))
        record.probe_max_activation.append(None if act is None else finite_or_none(float(act)))
        record.probe_time_s += time.monotonic() - start
        found = divergence(record.probe_steps, record.probe_loss, final=step >= probe.max_steps)
        if found is not None:
            raise DivergedError(found)

    class TraceCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if probe is not None:
                run_probe(0)

        def on_step_begin(self, args, state, control, **kwargs):
            record.step_loss = 0.0
            record.step_grad_norm = float("nan")
            record.step_max_activation = None
            record.step_batches = []
            record.step_supervised = None

        def on_step_end(self, args, state, control, **kwargs):
            scaler = trainer.accelerator.scaler
            skipped = bool(scaler is not None and trainer.accelerator.optimizer_step_was_skipped)
            step = state.global_step
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
            if probe is not None and (step % probe.interval_steps == 0 or step >= probe.max_steps):
                run_probe(step)

    trainer = TracingTrainer(
        model=model, args=args, train_dataset=rows, data_collator=collate, callbacks=[TraceCallback()]
    )
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
    import torch

    def hook(_module, inputs, output):
        tensors = [t for t in (*inputs, output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for t in tensors:
            peak = t.detach().abs().amax().float()
            if record.probing:
                cur = record.probe_step_max_activation
                record.probe_step_max_activation = peak if cur is None else torch.maximum(cur, peak)
                continue
            cur = record.step_max_activation
            record.step_max_activation = peak if cur is None else torch.maximum(cur, peak)

    return [module.register_forward_hook(hook) for module in model.modules() if isinstance(module, bnb.nn.Linear4bit)]
