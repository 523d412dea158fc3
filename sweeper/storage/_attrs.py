"""Every user attribute sweeper writes on a study or a trial, declared once, with its role.

Optuna keeps a study's and a trial's ``user_attrs`` as a free mapping; sweeper's are its stored schema, read back by
studies of older versions and by other machines' sweeps, so each key is named here and nowhere else: code writes
``trial.set_user_attr(TrialAttr.REASON, ...)`` and reads ``t.user_attrs.get(TrialAttr.STATUS)``. The names are plain
strings (class attributes, not an ``Enum``: every storage driver takes them as the keys they always were).

A trial's measured result (:class:`sweeper.trial.TrialResult`'s fields, ``peak_memory_gib`` to ``instability``) is
written field by field by :func:`sweeper.study.record_result` and declared by that dataclass; the members of
:class:`TrialAttr` are what is not a measurement (who ran it, where, its place among retries and repeats) and the few
result fields that are written or read without a ``TrialResult`` (a repeat's reason, the status a recovery reads).
"""

from __future__ import annotations

from typing import ClassVar, Final


class StudyAttr:
    """A study's user attributes (keys of ``study.user_attrs``)."""

    #: The study's identity, a random UUID written when it is created (or first opened by a version that writes
    #: one). It travels with the database: ownership of ``studies/<name>/`` goes by it, not by the database's path.
    STUDY_ID: Final = "study_id"
    #: The setups the study was measured under, in the order they were first run (:mod:`sweeper.study._setups`).
    SETUPS: Final = "setups"
    #: The index in :attr:`SETUPS` of the setup the latest ``sweep run`` measured.
    CURRENT_SETUP: Final = "current_setup"
    #: The search space file of the first ``sweep run``.
    SPACE_PATH: Final = "space_path"
    #: The searched keys, in the space's order (the report's and the dashboard's columns).
    SEARCHED: Final = "searched"
    #: The local checkpoint the trials loaded (the exports' model).
    MODEL_PATH: Final = "model_path"
    #: How many ``sweep run`` commands started on the study (the first writes the space's path).
    SWEEP_STARTS: Final = "sweep_starts"
    #: The default steps of a later ``sweep confirm`` (``study.confirm_steps``).
    CONFIRM_STEPS: Final = "confirm_steps"
    #: The fitted memory correction, ``{memory_kind: Calibration.to_dict()}`` (:mod:`sweeper.study._calibration`).
    MEMORY_CALIBRATION: Final = "memory_calibration"
    #: The study's own ``predicted_max_lr`` factor, written by ``sweep calibrate`` (:mod:`sweeper.sweep`).
    LR_CALIBRATION: Final = "lr_calibration"
    #: Prefix of one ``sweep calibrate`` run: ``lr_calibration_run:<trial>:<multiple>``.
    LR_CALIBRATION_RUN: Final = "lr_calibration_run:"
    #: The data's longest tokenized sample (tokens), set by each ``sweep run``.
    LONGEST_SAMPLE_TOKENS: Final = "longest_sample_tokens"
    #: The whole dataset file's rows with no supervised token at each searched ``max_seq_length`` that has any
    #: (``{"512": [280]}``), set by each ``sweep run``: the exports name them (issue 68).
    UNTRAINED_ROWS: Final = "data_untrained_rows"
    #: The devices its sweeps ran on, by name: ``{"device", "total_memory_gib"}`` each, set by each ``sweep run``.
    CARDS: Final = "cards"
    #: Prefix of the confirmation of trial N (``sweep confirm``): ``confirmation:N``.
    CONFIRMATION: Final = "confirmation:"
    #: Prefix of a confirmation that could not run (``confirmation_attempt:N``): an error, crash or timeout of the
    #: attempt, kept for the record, never the trial's confirmation.
    CONFIRMATION_ATTEMPT: Final = "confirmation_attempt:"


class TrialAttr:
    """A trial's user attributes that are not its measurement (keys of ``trial.user_attrs``).

    Those in :attr:`BOOKKEEPING` describe one run of a trial rather than its configuration's result: a repeat of a
    configuration copies the result, never these.
    """

    #: The trial's status (``TrialStatus`` value; a result field, read by recovery and repeats).
    STATUS: Final = "status"
    #: The line that says why the trial ended as it did (a result field; a repeat writes its own).
    REASON: Final = "reason"
    #: Seconds the trial ran (a result field; a repeat's is 0).
    WALL_TIME_S: Final = "wall_time_s"
    #: The trial's configuration, ``TrialConfig.to_dict()``.
    CONFIG: Final = "config"
    #: The corrected prediction the preflight used (GiB, the kind of ``peak_memory_gib``); absent before the study
    #: had a measured trial of this memory kind.
    CORRECTED_PEAK_GIB: Final = "corrected_peak_gib"
    #: The index in :attr:`StudyAttr.SETUPS` of the setup the trial was measured under.
    SETUP: Final = "setup"
    #: The host of the sweep that ran it (stale-trial recovery on that host checks the process).
    SWEEP_HOST: Final = "sweep_host"
    #: The process id of the sweep that ran it.
    SWEEP_PID: Final = "sweep_pid"
    #: The process id of the trial process that measured it.
    WORKER_PID: Final = "worker_pid"
    #: ``CUDA_VISIBLE_DEVICES`` of its worker slot.
    CUDA_VISIBLE_DEVICES: Final = "cuda_visible_devices"
    #: The heartbeat interval (s) of the sweep that ran it (a longer one than the reader's is not stale sooner).
    HEARTBEAT_INTERVAL_S: Final = "heartbeat_interval_s"
    #: The number of the trial this one retries (its first attempt's).
    RETRY_OF: Final = "retry_of"
    #: Which attempt this is (1 for the first retry).
    RETRY_ATTEMPT: Final = "retry_attempt"
    #: The trial was retried by a later one (it does not count toward ``n_trials``).
    RETRIED: Final = "retried"
    #: The trial was stopped by its sweep's end (Ctrl-C, a kill) or found stale: it does not count.
    INTERRUPTED: Final = "interrupted"
    #: The number of the trial whose result this repeat of its configuration copies (it does not count).
    DUPLICATE_OF: Final = "duplicate_of"

    #: The keys that describe one run of a trial (who ran it, where, its place among retries and repeats): a repeat
    #: of a configuration copies the result, never these.
    BOOKKEEPING: ClassVar[frozenset[str]] = frozenset(
        {
            SETUP,
            SWEEP_HOST,
            SWEEP_PID,
            WORKER_PID,
            CUDA_VISIBLE_DEVICES,
            HEARTBEAT_INTERVAL_S,
            RETRY_OF,
            RETRY_ATTEMPT,
            RETRIED,
            INTERRUPTED,
            DUPLICATE_OF,
        }
    )
