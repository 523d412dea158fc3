"""The worst-case step (child side; imports torch): :class:`WorstCase` runs one forward and backward of the data's
worst micro-batch after step 1, measured as the ``worst_case`` memory phase and then undone, so that a trial's peak
holds the step a long run will meet even when the short trial never drew it.
"""

from __future__ import annotations

from typing import Any

import torch

from sweeper.space import TrialConfig
from sweeper.trial._child.collate import model_inputs, pack_rows, worst_case_rows
from sweeper.trial._child.context import TrialContext
from sweeper.trial._child.instruments._base import Arming, Instrument
from sweeper.trial._job import Measures
from sweeper.trial._memory_phases import StepShape
from sweeper.trial._result import TrialResult


class WorstCase(Instrument):
    """The worst-case step (``Measures.worst_case``; False is a diagnostic). Its out-of-memory error is the
    configuration's (:attr:`owns_failure`); its seconds are not the training's (:attr:`undone`).

    Attributes:
        batch: The collated micro-batch of the data's longest rows (None: no rows).
        rows: Their dataset indices.
        shape: ``(rows, tokens)`` once it ran.
        supervised_tokens: The tokens its loss was computed on, once it ran.
    """

    name = "worst_case"
    memory_phase = "worst_case"
    undone = True
    owns_failure = True

    def __init__(self) -> None:
        super().__init__()
        self.batch: dict[str, Any] | None = None
        self.rows: list[int] = []
        self.shape: StepShape | None = None
        self.supervised_tokens: int | None = None

    @classmethod
    def wanted(cls, measures: Measures) -> bool:
        """Unless the job turned it off."""
        return measures.worst_case

    def arm(self, arming: Arming) -> int:
        """Collate the worst step's rows."""
        super().arm(arming)
        if arming.rows:
            worst = _worst_case_rows(arming.trial, arming.rows, arming.tokenizer)
            self.batch = arming.collate(worst)
            self.rows = sorted({int(i) for row in worst for i in _row_indices(row)})
        return 0

    def on_step_end(self, args, state, control, **kwargs):
        """Run the step after optimizer step 1, once the optimizer's state exists."""
        if state.global_step == 1 and not self.record.stressing:
            self.run()

    def run(self) -> None:
        """One forward and backward of :attr:`batch`, then undone: its gradients are dropped before any optimizer
        step, the random number generators (dropout's) are restored, and nothing is recorded in the traces, so the
        trial trains exactly as it would without it. Run after step 1, once the optimizer's state exists, so that
        its peak holds everything a training step of that shape holds. Sets ``shape``, ``supervised_tokens`` and
        ``time_s`` (seconds, memory phase changes included: what the trial's ``train_time_s`` leaves out, as the step
        leaves out its training).

        Raises:
            Exception: What the step raises (an out-of-memory error under the cap: the configuration's OOM, named
                by :meth:`failure_where`).
        """
        batch, record = self.batch, self.record
        if batch is None:
            return
        trainer, net = self.trainer, self.trainer.model
        cuda = torch.cuda.is_available()
        rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if cuda else None)
        fail_phase = record.fail_phase
        with self.running():
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
            rows, tokens = batch["input_ids"].shape
            self.shape = (int(rows), int(tokens))
            # what its loss was computed on (labels shift left by one: transformers' ForCausalLMLoss): 0 is a step of
            # rows whose replies lie past the cut, a NaN in a run that trains them alone (issue 68), not a silent 0
            self.supervised_tokens = int((batch["labels"][..., 1:] != -100).sum())
            record.fail_phase = fail_phase

    def failure_where(self) -> str | None:
        """``at the worst-case step, after step N (phase)``."""
        record = self.record
        return f"at the worst-case step, after step {record.step} ({record.fail_phase})"

    def failure_batch(self) -> dict[str, Any] | None:
        """Its batch: an OOM's shape is the data's longest rows'."""
        return self.batch

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """Its shape, rows, supervised tokens and seconds, where it ran."""
        if self.shape is None:
            return
        result.memory.worst_case_shape = self.shape
        result.data.worst_case_rows = list(self.rows)
        result.data.worst_case_supervised_tokens = self.supervised_tokens
        result.constant.worst_case_time_s = self.time_s


def _worst_case_rows(trial: TrialContext, rows: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """The rows of the worst-case step: the trial's own longest (:func:`sweeper.trial._child.collate.
    worst_case_rows`), or, when its job names the whole file's worst step (``Measures.worst_case_samples``: the
    trial samples fewer rows than the file the exports train), those samples of the file, tokenized as the trial's
    and packed a group to a row when packing. A named sample the file no longer holds is left out (the trial's own
    rows stand in when none is left)."""
    from sweeper.data import file_samples, tokenize_samples

    config, groups = trial.config, trial.measures.worst_case_samples
    if groups:
        samples = file_samples(config.dataset, [i for group in groups for i in group])
        tokenized = {t.index: t for t in tokenize_samples(samples, tokenizer, config.max_seq_length)}
        file_rows: list[dict[str, Any]] = []
        for group in groups:
            members = [
                {"input_ids": t.input_ids, "labels": t.labels, "index": t.index}
                for t in (tokenized.get(i) for i in group)
                if t is not None and t.input_ids
            ]
            file_rows += pack_rows(members, config.max_seq_length) if config.packing and members else members
        if file_rows:
            rows = file_rows
    return worst_case_rows(rows, config.per_device_train_batch_size)


def _row_indices(row: dict[str, Any]) -> list[int]:
    """The dataset indices a row of the trial holds: its sample's ``index``, or a packed row's list of them."""
    index = row.get("index")
    if index is None:
        return []
    return list(index) if isinstance(index, list) else [index]
