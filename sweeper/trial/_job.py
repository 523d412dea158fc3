"""The job line the sweep sends a trial process (shared by both sides of the process boundary; imports neither torch
nor optuna): one JSON object per line on the process's stdin, naming the trial's files."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TrialJob:
    """One trial for a trial process to run.

    Attributes:
        config_path: ``config.json``: ``{"config": TrialConfig.to_dict(), "model_path": str}``.
        result_path: Where the process writes the :class:`~sweeper.trial._result.TrialResult` as JSON.
        log_path: ``worker.log``: the process's stdout and stderr while it runs this trial.
        trial_dir: The trial's folder (the trainer's output, ``nan_batch.jsonl``).
    """

    config_path: str
    result_path: str
    log_path: str
    trial_dir: str

    def to_line(self) -> str:
        """The job as one JSON line, newline included."""
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def from_line(cls, line: str) -> TrialJob:
        """Inverse of :meth:`to_line` (extra keys are an error: the two sides are one version).

        Raises:
            ValueError: Not JSON. TypeError: Keys missing or unknown.
        """
        return cls(**json.loads(line))
