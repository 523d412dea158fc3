"""What every instrument of a trial is (child side; imports transformers): :class:`Instrument`, a
``transformers.TrainerCallback`` that measures one thing besides training, and :class:`Arming`, what it is given
before the trainer exists. The list of instruments is :data:`sweeper.trial._child.instruments.INSTRUMENTS`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from transformers import TrainerCallback

if TYPE_CHECKING:
    from sweeper.space import TrialConfig
    from sweeper.trial._child.context import TrialContext
    from sweeper.trial._child.record import TrainingRecord
    from sweeper.trial._job import Measures
    from sweeper.trial._result import TrialResult


@dataclass
class Arming:
    """What an instrument is armed with (:meth:`Instrument.arm`), once the trial's rows and collator exist and before
    the trainer is built.

    Attributes:
        trial: The trial (its config, record, measurements, progress and measures).
        rows: The rows the trial trains, tokenized (packed when it packs).
        unpacked: The same rows before packing (the probe's rows are samples, not packed rows).
        collate: The trial's collator.
        tokenizer: The trial's tokenizer.
        armed: The instruments armed before this one, by name (the stress phase reads the probe's).
    """

    trial: TrialContext
    rows: list[dict[str, Any]]
    unpacked: list[dict[str, Any]]
    collate: Any
    tokenizer: Any
    armed: dict[str, Instrument] = field(default_factory=dict)


class Instrument(TrainerCallback):
    """One measurement of a trial besides its training, as a ``transformers.TrainerCallback`` (transformers'
    ``EarlyStoppingCallback`` is the model): it says whether the job wants it (:meth:`wanted`, from
    :class:`~sweeper.trial._job.Measures`), is armed before the trainer exists (:meth:`arm`), hooks only the
    trainer events it needs, keeps its own small record on itself, runs its work inside :meth:`running` (the
    "instrument running" state the activation hook and a failure's outcome read, its memory phase and its time) and
    writes its part of the result (:meth:`write`), under that part's stored names.

    Adding one: its science (``sweeper.stability``), a subclass in this package, one line in
    :data:`~sweeper.trial._child.instruments.INSTRUMENTS` (or :func:`~sweeper.trial._child.instruments.
    register_instrument`), and its report line; an experimental one writes into ``TrialResult.experimental`` and
    needs no stored name (``tests/trial/test_instruments.py`` registers a toy one).

    Class attributes:
        name: Its name (an experimental one's key in ``TrialResult.experimental``).
        memory_phase: The memory phase its work is measured in (:data:`sweeper.trial._child.memory.MEMORY_PHASES`),
            None for the phase it runs in.
        undone: Its work is undone after it runs (nothing it did stays in the training): its seconds are taken out
            of the trial's ``train_time_s`` (by the worker, :func:`sweeper.trial._child.worker.run`).
        owns_failure: A failure inside it is the configuration's (the worst-case step's out-of-memory error): the
            running state and the memory phase stay as they were at the failure, for the outcome to name.
        watches_activations: The 4-bit layers' largest activation during its forwards goes to
            :attr:`max_activation` (the probe's); the other instruments' forwards are not watched.

    Attributes:
        trainer: The trainer (set once it exists).
        record: The trial's training record (set when armed).
        time_s: Seconds spent in :meth:`running` (timed ones).
        max_activation: The largest activation seen while it runs (a device tensor), for ``watches_activations``.
    """

    name: ClassVar[str] = ""
    memory_phase: ClassVar[str | None] = None
    undone: ClassVar[bool] = False
    owns_failure: ClassVar[bool] = False
    watches_activations: ClassVar[bool] = False

    def __init__(self) -> None:
        self.trainer: Any = None
        self.record: Any = None
        self.time_s = 0.0
        self.max_activation: Any = None

    @classmethod
    def wanted(cls, measures: Measures) -> bool:
        """Whether the job's :class:`~sweeper.trial._job.Measures` asks for it (default: always)."""
        return True

    def arm(self, arming: Arming) -> int:
        """Take what it needs from the trial before the trainer is built; returns the optimizer steps it adds to
        ``max_steps`` (the stress phase's), 0 by default."""
        self.record = arming.trial.record
        return 0

    def schedule(self) -> tuple[int, float] | None:
        """``(after_step, growth)`` when it drives the learning rate after the constant phase (the stress phase:
        step ``after_step + j`` at ``growth**j`` times the rate), else None."""
        return None

    @contextmanager
    def running(self, *, timed: bool = True) -> Iterator[None]:
        """Run its work: the record's :attr:`~sweeper.trial._child.record.TrainingRecord.running` is this instrument
        meanwhile, its :attr:`memory_phase` is measured, and with ``timed`` the seconds go to :attr:`time_s`. After a
        failure inside, an instrument that :attr:`owns_failure` leaves both as they were at the failure; the others
        are restored either way."""
        record: TrainingRecord = self.record
        before_running, start = record.running, time.monotonic()
        before_phase = record.enter_memory_phase(self.memory_phase) if self.memory_phase else None
        record.running = self
        failed = True
        try:
            yield
            failed = False
        finally:
            if timed:
                self.time_s += time.monotonic() - start
            if not (failed and self.owns_failure):
                record.running = before_running
                if before_phase is not None:
                    record.enter_memory_phase(before_phase)

    def failure_where(self) -> str | None:
        """Where a failure inside it happened, for the outcome's reason (None: the step's own words)."""
        return None

    def failure_batch(self) -> dict[str, Any] | None:
        """The micro-batch it was running when the trial failed (its shape names an out-of-memory error)."""
        return None

    def write(self, result: TrialResult, config: TrialConfig) -> None:
        """Write its part of ``result`` (its stored names; ``result.experimental[name]`` for an experimental one),
        once the trial has ended, whatever ended it. Nothing by default."""
