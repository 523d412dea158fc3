"""Helpers for sweeper's own tests, in the manner of ``optuna.testing``: spaces on a tiny model, studies built the way
the sweep records trials (:func:`sweeper.study.record_result` and :class:`sweeper.trial.TrialStatus`), and the
``sweep`` command run in a subprocess or in-process.

Nothing else in sweeper imports this package (an import-linter contract); torch is imported only inside the
functions that build models.
"""

from sweeper.testing._cli import CliResult, run_cli, sweep
from sweeper.testing._spaces import data_nan_space, tiny_space, write_jsonl, write_space
from sweeper.testing._studies import STUDY_DISTRIBUTIONS, add_configured_trials, add_trial, make_study

__all__ = [
    "STUDY_DISTRIBUTIONS",
    "CliResult",
    "add_configured_trials",
    "add_trial",
    "data_nan_space",
    "make_study",
    "run_cli",
    "sweep",
    "tiny_space",
    "write_jsonl",
    "write_space",
]
