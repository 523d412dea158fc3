"""Stale-trial recovery: a RUNNING trial whose sweep is gone is failed and its configuration queued again, as
Optuna's ``fail_stale_trials`` does for heartbeats, with the reason recorded first (Optuna's own fails the trial
before a callback could say why).

A trial is stale when its sweep process on this host is dead (found at once, by pid: ``interrupted``), or when its
sweep, anywhere, sent no Optuna heartbeat for :data:`~sweeper.storage._coordination.GRACE_INTERVALS` intervals
(killed on another machine, frozen, its machine gone: ``lost``). Only trials whose sweep beats at least as often as
this one are judged by heartbeat: a sweep that beats every 30 s is never called lost by one that beats every 1 s.

Also here: :func:`retry`, which queues a configuration again after a crash, a timeout or an interruption, up to
``max_retries`` times.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.storage._attrs import TrialAttr
from sweeper.storage._coordination import GRACE_INTERVALS
from sweeper.storage._optuna_private import fail_trial, heartbeat_interval, stale_trial_ids, storage_of, trial_id


def retry(study: optuna.Study, trial: FrozenTrial | optuna.Trial, max_retries: int, count: bool = True) -> bool:
    """Queue ``trial``'s params again when it has been retried fewer than ``max_retries`` times (always, when
    ``count`` is False: an interruption, which says nothing about the configuration); the new trial carries
    ``retry_of`` (the first attempt's number) and ``retry_attempt`` (not raised when ``count`` is False).

    Returns:
        Whether a retry was queued.
    """
    attempt = int(trial.user_attrs.get(TrialAttr.RETRY_ATTEMPT, 0))
    if count and attempt >= max_retries:
        return False
    first = trial.user_attrs.get(TrialAttr.RETRY_OF, trial.number)
    study.enqueue_trial(
        trial.params,
        user_attrs={TrialAttr.RETRY_OF: first, TrialAttr.RETRY_ATTEMPT: attempt + (1 if count else 0)},
        skip_if_exists=False,
    )
    return True


@dataclass(frozen=True)
class StaleTrial:
    """A trial :func:`fail_stale_trials` failed.

    Attributes:
        number: The trial's number.
        why: ``gone`` (its sweep process on this host is dead) or ``lost`` (its sweep sent no heartbeat).
        retried: Whether its configuration was queued again (not when it was already retried ``max_retries``
            times: a configuration whose runs keep dying may be what kills them).
    """

    number: int
    why: Literal["gone", "lost"]
    retried: bool = True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fail_running(study: optuna.Study, trial: FrozenTrial, reason: str, max_retries: int) -> bool | None:
    """Mark another sweep's RUNNING trial failed (``crash``, ``interrupted``, with ``reason``) and queue its retry
    (:func:`retry`: up to ``max_retries`` times).

    Returns:
        Whether a retry was queued; None when the trial had ended meanwhile (told by its own sweep, or failed by
        another one): nothing done.
    """
    try:
        fail_trial(study, trial, {TrialAttr.STATUS: "crash", TrialAttr.REASON: reason, TrialAttr.INTERRUPTED: True})
    except optuna.exceptions.UpdateFinishedTrialError:
        return None
    return retry(study, trial, max_retries)


def _stale_reason(trial: FrozenTrial, host: str, stale: set[int], interval: float | None) -> tuple[str, str] | None:
    """``(why, reason)`` when ``trial`` is stale (see the module docstring), else None."""
    pid = trial.user_attrs.get(TrialAttr.SWEEP_PID)
    if trial.user_attrs.get(TrialAttr.SWEEP_HOST) == host and pid is not None and not _pid_alive(int(pid)):
        # Its trial process died with it (PR_SET_PDEATHSIG); its pid may belong to another process now.
        return "gone", f"interrupted: the sweep process (pid {pid}) stopped while this trial ran"
    if interval is None or trial_id(trial) not in stale:
        return None
    # A sweep that beats less often than this one is judged by its own, longer grace period: by a sweep with its
    # interval or longer, or by its pid on its own host.
    if trial.user_attrs.get(TrialAttr.HEARTBEAT_INTERVAL_S, interval) > interval:
        return None
    who = f"pid {trial.user_attrs.get('sweep_pid', '?')} on {trial.user_attrs.get('sweep_host', '?')}"
    return "lost", f"lost: its sweep ({who}) sent no heartbeat for {GRACE_INTERVALS * interval} s"


def stale_running(study: optuna.Study, trials: Sequence[FrozenTrial] | None = None) -> dict[int, str]:
    """The study's RUNNING trials that no sweep runs any more, read-only (what ``sweep report`` shows), by number,
    each with a line saying since when: those whose sweep process on this host is gone (killed with ``kill -9``, a
    crash, a reboot), and those whose sweep, on any host, stopped sending heartbeats for longer than the grace period
    (:func:`sweeper.storage._optuna_private.stale_trial_ids`; the line gives the trial's start and the grace period, as
    Optuna keeps no readable time of the last heartbeat). The next ``sweep run`` of the study records them as
    interrupted or lost and runs them again. ``trials``: the study's trials as the caller just read them (the RUNNING
    ones are looked at), else they are read here."""
    host = socket.gethostname()
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    running = [t for t in trials if t.state == TrialState.RUNNING]
    if not running:
        return {}
    stale = set(stale_trial_ids(study))
    interval = heartbeat_interval(storage_of(study)) if stale else None
    out = {}
    for t in running:
        found = _stale_reason(t, host, stale, interval)
        if found is None:
            continue
        started = t.datetime_start.strftime("%Y-%m-%d %H:%M") if t.datetime_start else "?"
        pid = t.user_attrs.get(TrialAttr.SWEEP_PID)
        if found[0] == "gone":
            out[t.number] = f"trial {t.number}, started {started}: its sweep (pid {pid}) is gone"
        else:
            where = t.user_attrs.get(TrialAttr.SWEEP_HOST, "?")
            out[t.number] = (
                f"trial {t.number}, started {started}: its sweep (pid {pid} on {where}) has sent no heartbeat for "
                f"over {GRACE_INTERVALS * (interval or 0):g} s"
            )
    return out


def fail_stale_trials(study: optuna.Study, max_retries: int = 1) -> list[StaleTrial]:
    """Fail the study's stale RUNNING trials (``crash``, ``interrupted``, with the reason) and retry each
    configuration up to ``max_retries`` times. Call it under the ask lock.

    Returns:
        The trials failed here, by number (a trial another sweep failed first is not listed).
    """
    host = socket.gethostname()
    stale = set(stale_trial_ids(study))
    # stale_trial_ids found some: the storage is an RDBStorage with a heartbeat
    interval = heartbeat_interval(storage_of(study)) if stale else None
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        found = _stale_reason(t, host, stale, interval)
        if found is None:
            continue
        retried = _fail_running(study, t, found[1], max_retries)
        if retried is not None:
            failed.append(StaleTrial(t.number, found[0], retried))  # type: ignore[arg-type]
    return failed
