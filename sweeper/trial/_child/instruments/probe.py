"""The probe (child side; imports torch): :class:`ProbeInstrument` evaluates fixed rows without an update before the
first step, every few steps and at the last (:mod:`sweeper.stability`), raises
:class:`~sweeper.trial._child.record.DivergedError` once the probe loss shows the run diverged, and writes the probe's
traces, the instability, the projected failing step and the learning progress.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from sweeper.space import TrialConfig
from sweeper.stability import (
    PROBE_ROWS,
    compute_instability,
    divergence,
    learning_progress,
    probe_interval_steps,
    projected_fail_step,
)
from sweeper.trial._child.collate import model_inputs, pack_rows
from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.memory import PROBE_PHASE
from sweeper.trial._child.record import DivergedError, finite_or_none
from sweeper.trial._job import Measures, ProbeSettings
from sweeper.trial._result import TrialResult
from sweeper.trial._status import TrialStatus


@dataclass(frozen=True)
class Probe:
    """The fixed rows the trial evaluates without an update (see :mod:`sweeper.stability`).

    Attributes:
        batches: The probe rows collated as training collates them (model inputs only), each batch evaluated in one
            forward without gradients; the probe loss is the mean over all their supervised tokens. One batch of
            every row when the trial's micro-batch holds at least as many rows (each forward dequantizes every 4-bit
            weight once, which at short lengths costs more than the rows themselves); one batch per row at a smaller
            micro-batch, so that the probe never processes more tokens in one forward than a training step does.
        interval_steps: Optimizer steps between probes (:func:`sweeper.stability.probe_interval_steps`).
        max_steps: The run's last step, which is always probed.
    """

    batches: list[dict[str, Any]]
    interval_steps: int
    max_steps: int


def make_probe(
    rows: list[dict[str, Any]], collate: Any, config: TrialConfig, settings: ProbeSettings | None
) -> Probe | None:
    """The probe: the first :data:`~sweeper.stability.PROBE_ROWS` samples of the trial's data that keep a supervised
    token after truncation, collated as training collates them (packed into rows when training packs), in one batch
    when the trial's micro-batch holds that many rows, else one batch per row (a probe forward never holds more rows
    than a training step); evaluated every ``settings.interval_steps`` steps (None:
    :func:`~sweeper.stability.probe_interval_steps` of the batch). None when no sample has a supervised token, or
    when the job asked for none (``settings`` None: a diagnostic, the tests compare training with and without it)."""
    if settings is None:
        return None
    chosen = [row for row in rows if any(label != -100 for label in row["labels"][1:])][:PROBE_ROWS]
    if not chosen:
        return None
    if config.packing:
        chosen = pack_rows(chosen, config.max_seq_length)
    per_batch = len(chosen) if config.per_device_train_batch_size >= len(chosen) else 1
    batches = [model_inputs(collate(chosen[i : i + per_batch])) for i in range(0, len(chosen), per_batch)]
    interval = settings.interval_steps
    if interval is None:
        interval = probe_interval_steps(config.per_device_train_batch_size, config.gradient_accumulation_steps)
    return Probe(batches=batches, interval_steps=interval, max_steps=config.max_steps)


class ProbeInstrument(Instrument):
    """The probe (``Measures.probe``; None turns it off, a diagnostic). Its memory is the ``probe`` phase's; its
    forwards run in training mode with only the dropout modules in eval mode (:meth:`measure`).

    Attributes:
        probe: The rows and schedule (None: no sample keeps a supervised token; nothing is measured).
        steps, loss, max_activation_trace, update_ratio: Per constant-phase probe: its step, loss, largest 4-bit
            activation and the adapters' update-to-weight ratio (None where non-finite).
        base_weight_norm: The base weights' Frobenius norm (dequantized once per trial).
    """

    name = "probe"
    memory_phase = PROBE_PHASE
    watches_activations = True

    def __init__(self) -> None:
        super().__init__()
        self.probe: Probe | None = None
        self.steps: list[int] = []
        self.loss: list[float | None] = []
        self.max_activation_trace: list[float | None] = []
        self.update_ratio: list[float | None] = []
        self.base_weight_norm: float | None = None

    @classmethod
    def wanted(cls, measures: Measures) -> bool:
        """Unless the job turned the probe off."""
        return measures.probe is not None

    def arm(self, arming: Arming) -> int:
        """Build the probe from the trial's unpacked rows."""
        super().arm(arming)
        trial = arming.trial
        self.probe = make_probe(arming.unpacked, arming.collate, trial.config, trial.measures.probe)
        return 0

    def on_train_begin(self, args, state, control, **kwargs):
        """Probe the untrained adapter (step 0)."""
        if self.probe is not None:
            self.read(0)

    def on_step_end(self, args, state, control, **kwargs):
        """Probe a constant-phase step when due (every ``interval_steps`` and the last)."""
        probe, step = self.probe, state.global_step
        if probe is None or self.record.stressing:
            return
        if step % probe.interval_steps == 0 or step >= probe.max_steps:
            self.read(step)

    def measure(self) -> float:
        """The probe's mean loss over its supervised tokens (forwards without gradients, dropout off), NaN when it has
        no supervised token.

        The model runs in training mode with only its dropout modules in eval mode, and every module's mode is
        restored afterwards: on a CPU with AVX512-BF16, bitsandbytes repacks a ``Linear4bit``'s weights for
        inference at its first forward outside training mode (``Linear4bit.forward``,
        ``_convert_weight_packed_for_cpu``), and training would go on with other kernels and other numbers.
        Measured on the built-in model: a probe in eval mode moved the loss of step 1 from 3.55 to 3.54 and made the
        run at learning rate 3e-3 diverge at step 24; this way the training trace is the same bit for bit as without
        a probe (``tests/sweep/test_confirm.py``).
        """
        assert self.probe is not None
        net: Any = self.trainer.model
        modes = [(m, m.training) for m in net.modules()]
        net.train()
        for m in net.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
        self.max_activation = None
        try:
            with self.running(timed=False):
                total, count = 0.0, 0
                with torch.no_grad():
                    for batch in self.probe.batches:
                        batch = {k: v.to(self.trainer.args.device) for k, v in batch.items()}
                        n = int((batch["labels"][..., 1:] != -100).sum())
                        total += float(net(**batch).loss.float()) * n
                        count += n
                return total / count if count else float("nan")
        finally:
            for m, training in modes:
                m.train(training)

    def read(self, step: int) -> None:
        """A constant-phase probe at ``step``: its loss, activation and update ratio appended, its seconds counted;
        raises :class:`DivergedError` once :func:`sweeper.stability.divergence` says the run diverged."""
        assert self.probe is not None
        start = time.monotonic()
        value = self.measure()
        act = self.max_activation
        self.steps.append(step)
        self.loss.append(finite_or_none(value))
        self.update_ratio.append(update_to_weight_ratio(self.trainer.model, self))
        self.max_activation_trace.append(None if act is None else finite_or_none(float(act)))
        self.time_s += time.monotonic() - start
        found = divergence(self.steps, self.loss, final=step >= self.probe.max_steps)
        if found is not None:
            raise DivergedError(found)

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """The probe's traces and cost, and what is read from them: the instability terms and the projected failing
        step for a trial that trained on the configuration's own terms (``complete``, ``nan`` not of the data,
        ``diverged``), and the learning progress."""
        constant = result.constant
        constant.probe_steps, constant.probe_loss_trace = self.steps, self.loss
        constant.probe_max_activation_trace = self.max_activation_trace
        constant.update_ratio_trace = self.update_ratio
        constant.probe_time_s = self.time_s
        training_s = (constant.train_time_s or 0.0) - self.time_s
        constant.probe_time_share = self.time_s / training_s if training_s > 0 and self.steps else None
        if not self.steps or result.nan.cause == "data":
            return  # no probe, or the data failed rather than the configuration: its trace says nothing of stability
        if result.status in (TrialStatus.COMPLETE, TrialStatus.NAN, TrialStatus.DIVERGED):
            _instability(result, self.steps, self.loss, self.max_activation_trace, config)
        constant.learning_progress = learning_progress(self.loss)


def _instability(
    result: TrialResult,
    steps: list[int],
    loss: list[float | None],
    max_activation: list[float | None],
    config: TrialConfig,
) -> None:
    """The instability terms (:func:`sweeper.stability.compute_instability`) and the projected failing step."""
    constant = result.constant
    constant.projected_fail_step = projected_fail_step(steps, loss)
    components = compute_instability(
        probe_loss=loss,
        probe_max_activation=max_activation,
        skipped=[s in constant.skipped_steps for s in range(1, len(constant.loss_trace) + 1)],
        steps=len(constant.loss_trace),
        compute_dtype=config.bnb_4bit_compute_dtype,
        loss=constant.loss_trace,
        grad_norm=constant.grad_norm_trace,
    )
    constant.instability = components.instability
    constant.instability_components = {k: v for k, v in components.to_dict().items() if k != "instability"}


def update_to_weight_ratio(net: Any, probe: ProbeInstrument) -> float | None:
    """The LoRA update's Frobenius norm over the base weights', ``sqrt(sum ||s B A||^2) / sqrt(sum ||W||^2)`` over
    every adapted layer (``s`` its ``scaling``, ``B A`` its low-rank product); None when non-finite or no layer is
    adapted. ``||B A||_F^2 = sum((B^T B) * (A A^T))`` (r x r products, cheap at any width); the base weights are
    dequantized once per trial and their norm kept in ``probe.base_weight_norm``."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in net.modules() if isinstance(m, LoraLayer)]
    if not layers:
        return None
    with torch.no_grad():
        if probe.base_weight_norm is None:
            import bitsandbytes.functional as bnbf

            total = 0.0
            for m in layers:
                weight: Any = m.get_base_layer().weight
                state = getattr(weight, "quant_state", None)
                dense: Any = bnbf.dequantize_4bit(weight.data, state) if state is not None else weight
                total += float(dense.float().pow(2).sum())
            probe.base_weight_norm = math.sqrt(total)
        update = 0.0
        for m in layers:
            for name, a in m.lora_A.items():
                A: Any = a.weight.float()
                B: Any = m.lora_B[name].weight.float()
                update += m.scaling[name] ** 2 * float(((B.T @ B) * (A @ A.T)).sum())
    ratio = math.sqrt(max(update, 0.0)) / probe.base_weight_norm if probe.base_weight_norm else None
    return ratio if ratio is not None and math.isfinite(ratio) else None
