"""Helpers for sweeper's own tests, in the manner of ``optuna.testing``: spaces on a tiny model, studies built the way
the sweep records trials (:func:`sweeper.study.record_result` and :class:`sweeper.trial.TrialStatus`), and the
``sweep`` command run in a subprocess or in-process, the tiny models the trials train, and a PostgreSQL server on
loopback.

Nothing else in sweeper imports this package (an import-linter contract); torch is imported only inside the
functions that build models.
"""

from sweeper.testing._cli import CliResult, run_cli, sweep
from sweeper.testing._data import GENERATION_CHATML, TOPICS, clean_rows
from sweeper.testing._models import (
    OUTLASTS_ANY_TIMEOUT,
    PAD_ID,
    TINY_VOCAB,
    build_pad_token_model,
    build_tiny_model,
    long_reply_rows,
    tiny_trial_config,
)
from sweeper.testing._paths import REPO
from sweeper.testing._postgres import PASSWORD, PgServer, pg_bin, start_server
from sweeper.testing._spaces import MEMORY_BASE, data_nan_space, tiny_space, write_jsonl, write_space
from sweeper.testing._stacks import STACKS, run_in_venv, stack_venv
from sweeper.testing._studies import STUDY_DISTRIBUTIONS, add_configured_trials, add_trial, make_study

__all__ = [
    "GENERATION_CHATML",
    "MEMORY_BASE",
    "OUTLASTS_ANY_TIMEOUT",
    "PAD_ID",
    "PASSWORD",
    "REPO",
    "STACKS",
    "STUDY_DISTRIBUTIONS",
    "TINY_VOCAB",
    "TOPICS",
    "CliResult",
    "PgServer",
    "add_configured_trials",
    "add_trial",
    "build_pad_token_model",
    "build_tiny_model",
    "clean_rows",
    "data_nan_space",
    "long_reply_rows",
    "make_study",
    "pg_bin",
    "run_cli",
    "run_in_venv",
    "stack_venv",
    "start_server",
    "sweep",
    "tiny_space",
    "tiny_trial_config",
    "write_jsonl",
    "write_space",
]
