"""Experimental: the critical learning rate's line search, run inside a trial (child process; imports torch), as the
:class:`CriticalLr` instrument (on only when the job names it: ``Measures(experimental=("critical_lr",))``;
:mod:`sweeper.stability.experimental`). At a line-search point, just before the optimizer applies its update, the
update is computed on a copy of nothing but the adapter's weights and the optimizer's state (the optimizer steps once,
the update is read off the weights, and weights and state are put back bit for bit), and each probe row's loss, and
the mean loss of each of the step's own micro-batches (the batches the update was computed on, Kalra et al.'s own
reading), are read at multiples of it (:func:`sweeper.stability.experimental.critical_multiples`). Nothing the trial
trains or records changes: the weights, the gradients, the optimizer's state, the random state and every module's
mode are as they were, the activation hooks do not see its forwards, and its memory is the ``probe`` phase's (never
the judged peak). Its figures go to ``TrialResult.experimental["critical_lr"]``, outside the stable stored names.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from sweeper.space import TrialConfig
from sweeper.stability.experimental import critical_multiples, critical_rate_of, line_search_points
from sweeper.trial._child.collate import model_inputs
from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._child.instruments.probe import Probe, ProbeInstrument
from sweeper.trial._child.memory import PROBE_PHASE, is_oom
from sweeper.trial._job import Measures
from sweeper.trial._result import TrialResult


class CriticalLr(Instrument):
    """The critical learning rate's line searches (experimental). Its seconds are not the training's
    (:attr:`undone`).

    Attributes:
        points: The steps before whose update a search runs.
        readings, step_readings: ``(step, row, multiple, censored)`` on the probe rows, and on the step's own
            micro-batches.
        forwards: Forward passes taken.
        skipped: Why a search did not run, None when every point ran.
        start: The multiple the next search starts from.
    """

    name = "critical_lr"
    memory_phase = PROBE_PHASE
    undone = True

    def __init__(self) -> None:
        super().__init__()
        self.probe: Probe | None = None
        self.points: list[int] = []
        self.readings: list[tuple[int, int, float, bool]] = []
        self.step_readings: list[tuple[int, int, float, bool]] = []
        self.forwards = 0
        self.skipped: str | None = None
        self.start = 1.0

    @classmethod
    def wanted(cls, measures: Measures) -> bool:
        """When the job names it among its experimental measures."""
        return cls.name in measures.experimental

    def arm(self, arming: Arming) -> int:
        """Its points, when the trial has a probe (it reads the probe's rows)."""
        super().arm(arming)
        probe = arming.armed.get(ProbeInstrument.name)
        if isinstance(probe, ProbeInstrument) and probe.probe is not None:
            self.probe = probe.probe
            self.points = line_search_points(arming.trial.config.max_steps)
        return 0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Search before the update of a constant-phase step that is one of :attr:`points`."""
        step = state.global_step + 1
        if self.probe is not None and not self.record.stressing and step in self.points:
            self.search(step)

    def search(self, step: int) -> None:
        """Line-search the critical multiple of each probe row at optimizer step ``step`` (before its update), and
        append the readings, forwards and seconds. The search starts at the last point's smallest reading, to spend
        fewer forwards.

        It does not run (:attr:`skipped` says why) when a gradient is not finite or the fp16 scaler has not unscaled
        the gradients; an out-of-memory error inside it is recorded there too, and the trial goes on: the
        instrument's memory is not the configuration's.
        """
        trainer, probe = self.trainer, self.probe
        assert probe is not None
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        skipped = _why_not(trainer, params, step)
        if skipped:
            self.skipped = skipped
            return
        net: Any = trainer.model
        modes = [(m, m.training) for m in net.modules()]
        cuda = torch.cuda.is_available()
        rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if cuda else None)
        origin = [p.detach().clone() for p in params]
        try:
            with self.running():
                net.train()
                for m in net.modules():
                    if isinstance(m, torch.nn.Dropout):
                        m.eval()
                with torch.no_grad():
                    direction = _next_update(optimizer, params)
                    own = [model_inputs(b) for b in self.record.step_batches]  # the micro-batches of this update
                    rows = sum(int(b["input_ids"].shape[0]) for b in probe.batches)

                    def evaluate(multiple: float) -> list[float]:
                        for p, o, d in zip(params, origin, direction):
                            p.copy_(o)
                            if multiple:
                                p.add_(d, alpha=multiple)
                        device = trainer.args.device
                        return _row_losses(net, probe.batches, device) + _row_losses(net, own, device, per_row=False)

                    brackets, forwards = critical_multiples(evaluate, start=self.start)
                self.forwards += forwards
                self._record_readings(brackets, rows, step)
        except Exception as exc:  # the instrument's own failure is recorded, never the trial's
            if not is_oom(exc) and not isinstance(exc, ValueError):
                raise
            self.skipped = f"the line search at step {step} did not finish: {type(exc).__name__}: {exc}"
        finally:
            with torch.no_grad():
                for p, o in zip(params, origin):
                    p.copy_(o)
            for m, training in modes:
                m.train(training)
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state_all(rng[1])

    def _record_readings(self, brackets: list[Any], rows: int, step: int) -> None:
        """Append step ``step``'s brackets: the first ``rows`` are the probe rows' (:attr:`readings`), the rest the
        step's own micro-batches' (:attr:`step_readings`); the next search starts at the smallest uncensored multiple
        found."""
        for i, bracket in enumerate(brackets):
            if bracket.multiple is None:
                continue
            if i < rows:  # a probe row
                self.readings.append((step, i, bracket.multiple, bracket.censored))
            else:  # the step's own micro-batch i - rows
                self.step_readings.append((step, i - rows, bracket.multiple, bracket.censored))
        found = [b.multiple for b in brackets if b.multiple is not None and not b.censored]
        if found:
            self.start = min(found)

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """``result.experimental["critical_lr"]``: the critical rate from the readings
        (:func:`sweeper.stability.experimental.critical_rate_of`), their cost, and why one did not run."""
        out: dict[str, Any] = {"line_search_skipped": self.skipped}
        if self.forwards:
            rate = critical_rate_of(self.readings, config.max_steps, self.forwards)
            own = critical_rate_of(self.step_readings, config.max_steps)
            train_s = result.constant.train_time_s
            out.update(
                critical_lr_multiple=rate.multiple,
                critical_lr_multiple_low=rate.multiple_low,
                critical_lr_multiple_high=rate.multiple_high,
                critical_lr_slope_per_step=rate.slope_per_step,
                critical_lr_projected_step=rate.projected_step,
                critical_lr_projected_step_low=rate.projected_step_low,
                critical_lr_projected_step_high=rate.projected_step_high,
                critical_lr_readings=[list(r) for r in rate.readings],
                critical_lr_step_multiple=own.multiple,
                critical_lr_step_readings=[list(r) for r in own.readings],
                line_search_forwards=rate.forwards,
                line_search_time_s=self.time_s,
                line_search_time_share=self.time_s / train_s if train_s else None,
            )
        result.experimental[self.name] = out


def _row_losses(net: Any, batches: list[dict[str, Any]], device: Any, per_row: bool = True) -> list[float]:
    """Each row's mean loss over its supervised tokens (the causal shift as the model's own loss), one forward per
    batch; with ``per_row`` False each batch's mean over all its supervised tokens instead. ``inf`` where a loss is
    not finite."""
    out: list[float] = []
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        labels = batch.pop("labels")
        logits = net(**batch).logits
        shifted = labels[:, 1:]
        flat = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), shifted.flatten(), reduction="none", ignore_index=-100
        ).view(shifted.shape)
        counts = (shifted != -100).sum(dim=1)
        totals = flat.sum(dim=1)
        if not per_row:
            totals, counts = totals.sum().reshape(1), counts.sum().reshape(1)
        for total, n in zip(totals.tolist(), counts.tolist()):
            value = total / n if n else math.nan
            out.append(value if math.isfinite(value) else math.inf)
        del logits, flat
    return out


def _next_update(optimizer: Any, params: list[Any]) -> list[Any]:
    """The update ``optimizer.step()`` would apply now to ``params``, leaving the params and the optimizer's state
    exactly as they were (tensors copied back in place, so paged or quantized state keeps its storage)."""
    saved_params = [p.detach().clone() for p in params]
    saved_state = {}
    for p in params:
        state = optimizer.state.get(p)
        saved_state[p] = (
            None
            if state is None
            else {k: v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in state.items()}
        )
    try:
        optimizer.step()
        return [p.detach() - s for p, s in zip(params, saved_params)]
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved_params):
                p.copy_(s)
        for p, saved in saved_state.items():
            if saved is None:
                optimizer.state.pop(p, None)
                continue
            state = optimizer.state[p]
            for k in [k for k in state if k not in saved]:
                del state[k]
            for k, v in saved.items():
                if torch.is_tensor(v) and torch.is_tensor(state.get(k)) and state[k].shape == v.shape:
                    state[k].copy_(v)
                else:
                    state[k] = v


def _why_not(trainer: Any, params: list[torch.Tensor], step: int) -> str | None:
    """Why the line search cannot read step ``step``'s update (the fp16 gradients still scaled, a gradient not
    finite), or None."""
    if trainer.accelerator.scaler is not None and trainer.args.max_grad_norm <= 0:
        return "the fp16 gradients are still scaled (max_grad_norm 0): no line search"
    if not all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params):
        return f"a gradient is not finite at step {step}: no line search there"
    return None
