"""The sweep's run loop. Each trial goes through the same steps:

1. **ask** (:meth:`RunningSweep.ask`): under the ask lock, fail stale trials (:func:`fail_stale_trials`), stop at
   ``n_trials``, the time budget or too many repeats, else ask the sampler;
2. **settle** without running it: a repeat of a configuration already measured reuses that result
   (:func:`settle_repeat`), a configuration the memory model or a known OOM says cannot fit is pruned
   (:func:`settle_prediction`);
3. **measure** it in a trial process (:func:`measure`, the worker slot's :class:`sweeper.trial.TrialProcess`);
4. **tell** the study its outcome, with its artifacts (:func:`tell`), and **retry** what may go differently
   another time (crash, timeout; :func:`sweeper.storage._recovery.retry`).

Several worker slots (threads) may run in one sweep process and several processes on one study (see
:mod:`sweeper.storage._coordination`). Resuming is running the same command again: the study is loaded, stale
trials are failed and retried, and the loop stops when the study holds ``n_trials`` finished trials.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import optuna

from sweeper.storage import StudyAttr
from sweeper.study import make_sampler
from sweeper.sweep._callbacks import SweepCallback
from sweeper.sweep._plan import SweepPlan
from sweeper.sweep._running import RunningSweep, run_slot, slot_main


def run_study(plan: SweepPlan, callbacks: Sequence[SweepCallback] = ()) -> optuna.Study:
    """Run the planned sweep (:func:`sweeper.sweep._plan.plan_sweep`) until its study holds ``n_trials`` finished
    trials, or its ``timeout_s`` has passed, or the sampler proposed only configurations already measured
    ``plan.max_consecutive_repeats`` times in a row.

    Several ``run_study`` calls (processes, machines) may share one study: they never start more than ``n_trials``
    trials between them (:class:`sweeper.storage._coordination.AskLock`), and find each other's dead or silent trials
    (:func:`sweeper.storage._recovery.fail_stale_trials`).

    Args:
        plan: The checked sweep, its study opened.
        callbacks: Told of each trial started and finished, and of bookkeeping notes (:class:`SweepCallback`).

    Returns:
        The plan's study.

    Raises:
        StudyError: The storage cannot be written.
        RunError: The studies folder's disk is full, or a trial's files cannot be written.
        KeyboardInterrupt: After the running trials were killed and recorded as interrupted.
    """
    study, space = plan.study, plan.space
    if StudyAttr.SPACE_PATH not in study.user_attrs:
        study.set_user_attr(StudyAttr.SPACE_PATH, space.path)
        study.set_user_attr(StudyAttr.SEARCHED, list(space.search))
    if study.user_attrs.get(StudyAttr.MODEL_PATH) != plan.model_path:
        study.set_user_attr(
            StudyAttr.MODEL_PATH, plan.model_path
        )  # the local checkpoint the trials loaded (for exports)
    sweep = RunningSweep(plan, callbacks)
    with sweep.lock.held():
        starts = int(study.user_attrs.get(StudyAttr.SWEEP_STARTS, 0))
        if sweep.view.finished < plan.n_trials:  # a run with nothing to start does not shift later runs' seeds
            study.set_user_attr(StudyAttr.SWEEP_STARTS, starts + 1)
    if starts and space.study.seed is not None:
        # Every sweep of the study (started together on several machines, or resuming) samples from its own seed:
        # with one seed they would all propose the same first configurations.
        study.sampler = make_sampler(space.study, plan.n_trials, seed=space.study.seed + starts)
    if plan.workers == 1:
        run_slot(sweep, 0)  # in this thread: Ctrl-C reaches TrialProcess.run, which kills the trial process
    else:
        _run_slots(sweep)
    return study


def _run_slots(sweep: RunningSweep) -> None:
    """Run the sweep's worker slots in threads until each has recorded its last trial; Ctrl-C kills the running
    trial processes, waits for each slot to record its trial as interrupted, and is raised again."""
    done = [threading.Event() for _ in range(sweep.workers)]
    threads = [
        threading.Thread(target=slot_main, args=(sweep, i, done[i]), name=f"sweep-slot-{i}")
        for i in range(sweep.workers)
    ]
    for thread in threads:
        thread.start()
    # The main thread waits by polling, never inside Thread.join: in CPython 3.11 a KeyboardInterrupt that lands
    # in join can mark a running thread as stopped, and the interpreter would then exit without it.
    try:
        while not all(d.is_set() for d in done):
            time.sleep(0.2)
    except KeyboardInterrupt:
        sweep.interrupt()
        while not all(d.is_set() for d in done):  # each slot records its killed trial as interrupted
            try:
                time.sleep(0.1)
            except KeyboardInterrupt:
                continue  # a second Ctrl-C: the trials are being recorded, which takes a moment
        raise
    for thread in threads:
        thread.join()
    if sweep.errors:
        raise sweep.errors[0]
