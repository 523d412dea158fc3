"""One trial as the trial process runs it (child side, imports no torch): :class:`TrialContext`, what the job asked
for and where the trial's measurements go, handed by :func:`sweeper.trial._child.worker.run` to the recipe
(:mod:`sweeper.trial._child.recipe`) in one piece."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.space import TrialConfig
from sweeper.trial._child.measurements import Measurements
from sweeper.trial._child.progress import ProgressSender
from sweeper.trial._child.record import TrainingRecord
from sweeper.trial._child.warm import WarmState
from sweeper.trial._job import DEFAULT_MEASURES, Measures


@dataclass
class TrialContext:
    """One trial in this process.

    Attributes:
        config: The trial's settings.
        model_path: A local checkpoint (:func:`sweeper.model.resolve_model`).
        trial_dir: The trial's folder: the trainer's output and ``nan_batch.jsonl`` go there.
        record: What training records, step by step.
        measured: The trial's other measurements as they become known.
        warm: What this process keeps between trials (updated in place).
        progress: Where the trial's progress lines go.
        measures: The stress phase, probe and worst-case step the job asked for (:class:`sweeper.trial._job.
            Measures`).
        instruments: The instruments it runs (:mod:`sweeper.trial._child.instruments`), made by the recipe's setup
            from ``measures``; empty before.
    """

    config: TrialConfig
    model_path: str
    trial_dir: Path
    record: TrainingRecord
    measured: Measurements
    warm: WarmState
    progress: ProgressSender
    measures: Measures = DEFAULT_MEASURES
    instruments: list[Any] = field(default_factory=list)
