"""The per-step traces (child side; imports torch): :class:`Traces` opens and closes each optimizer step of the
constant phase in the :class:`~sweeper.trial._child.record.TrainingRecord` (raw loss, pre-clip gradient norm,
largest 4-bit activation, supervised tokens, fp16 scaler skips, the step's rows kept as the last finite step's),
raises :class:`~sweeper.trial._child.record.NonFiniteError` for a non-finite gradient norm the scaler did not skip,
and sends each step's progress line; :func:`track_activations` keeps the largest activation of the 4-bit layers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.record import NonFiniteError, TrainingRecord, finite_or_none


class Traces(Instrument):
    """The constant phase's per-step traces and progress lines (always on; their stored names are
    :class:`~sweeper.trial._result.ConstantPhase`'s ``*_trace``, written with the rest of the record by the worker).
    Steps of the stress phase (``record.stressing``) are the stress instrument's."""

    name = "traces"

    def arm(self, arming: Arming) -> int:
        """Keep the record and where progress goes."""
        super().arm(arming)
        self.progress = arming.trial.progress
        self.constant_steps = arming.trial.config.max_steps
        return 0

    def on_train_begin(self, args, state, control, **kwargs):
        """Say that training began (step 0 of the constant phase): with many micro-batches a step, the first step's
        own report can come minutes after the model finished loading."""
        self.progress.report("train", step=0, of=self.constant_steps)

    def on_step_begin(self, args, state, control, **kwargs):
        """Reset the step's values."""
        record = self.record
        record.step_loss = 0.0
        record.step_grad_norm = float("nan")
        record.step_max_activation = None
        record.step_batches = []
        record.step_supervised = None

    def on_step_end(self, args, state, control, **kwargs):
        """Append the finished constant-phase step's values to the traces and send its progress line."""
        record: TrainingRecord = self.record
        if record.stressing:
            return
        accelerator = self.trainer.accelerator
        skipped = bool(accelerator.scaler is not None and accelerator.optimizer_step_was_skipped)
        step = state.global_step
        self.progress.report("train", step=step, of=self.constant_steps, loss=record.step_loss)
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


def track_activations(model: Any, record: TrainingRecord) -> list[Any]:
    """Forward hooks on every ``bitsandbytes.nn.Linear4bit`` keeping the step's largest |input| and |output|, or,
    while an instrument runs (``record.running``), its own when it watches activations (the probe's) and none
    otherwise.

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
            running = record.running
            if running is not None:
                if running.watches_activations:
                    cur = running.max_activation
                    running.max_activation = peak if cur is None else torch.maximum(cur, peak)
                continue
            cur = record.step_max_activation
            record.step_max_activation = peak if cur is None else torch.maximum(cur, peak)

    return [module.register_forward_hook(hook) for module in model.modules() if isinstance(module, bnb.nn.Linear4bit)]
