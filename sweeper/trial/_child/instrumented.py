"""The trainer of a trial (child process; imports torch and transformers): a ``transformers.Trainer``
(:class:`TracingTrainer`) that records each micro-batch's raw loss, supervised tokens and rows and each step's
pre-clip gradient norm into a :class:`~sweeper.trial._child.record.TrainingRecord`, with the trial's instruments
(:mod:`sweeper.trial._child.instruments`) as its callbacks. Used by :mod:`sweeper.trial._child.recipe` only, and
imported with the heavy libraries (:func:`sweeper.trial._child.worker.import_heavy`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import Trainer

from sweeper.trial._child.collate import model_inputs, sample_indices
from sweeper.trial._child.instruments import Instrument
from sweeper.trial._child.record import NonFiniteError, TrainingRecord


class TracingTrainer(Trainer):
    """A ``Trainer`` that reads the data in order, records each micro-batch's rows, supervised tokens, loss and the
    step's pre-clip gradient norm into ``record``, and raises :class:`NonFiniteError` at the first non-finite value
    (an input id outside ``[0, vocab_size)`` before the forward; a loss; a gradient norm without an fp16 scaler).

    Args:
        record: Where the measurements go.
        vocab_size: Rows of the model's input embedding.
        schedule: ``(after_step, growth)`` when an instrument drives the rate after the constant phase
            (:meth:`~sweeper.trial._child.instruments.Instrument.schedule`), else None.
        *args, **kwargs: ``transformers.Trainer``'s.
    """

    def __init__(
        self, *args: Any, record: TrainingRecord, vocab_size: int, schedule: tuple[int, float] | None, **kwargs: Any
    ):
        self.record, self.vocab_size, self.schedule = record, vocab_size, schedule
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps, optimizer=None):
        """``constant_with_warmup`` (as ``Trainer`` builds it) for the constant phase; with a stress phase
        (:attr:`schedule`), stress step ``j`` then runs at ``growth**j`` times the learning rate."""
        if self.schedule is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        warmup, (after, growth) = self.args.warmup_steps, self.schedule

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


def make_trainer(
    model: Any, args: Any, rows: list[dict], collate: Any, record: TrainingRecord, instruments: list[Instrument]
) -> TracingTrainer:
    """A :class:`TracingTrainer` with the trial's ``instruments`` as its callbacks (in their order, after
    transformers' own): it records every optimizer step's raw loss, pre-clip gradient norm and supervised tokens,
    keeps the step's rows, and raises :class:`NonFiniteError` at the first non-finite value, before the optimizer
    applies it (so the weights stay those the step failed on; with an fp16 loss scaler, a skipped step is not a
    failure). The instruments come armed (:meth:`~sweeper.trial._child.instruments.Instrument.arm`, by the recipe),
    and ``args.max_steps`` already includes the steps they add; the trainer is set on each here."""
    schedule = next((s for s in (i.schedule() for i in instruments) if s is not None), None)
    trainer = TracingTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=collate,
        callbacks=list(instruments),
        record=record,
        vocab_size=model.get_input_embeddings().num_embeddings,
        schedule=schedule,
    )
    for instrument in instruments:
        instrument.trainer = trainer
    return trainer
