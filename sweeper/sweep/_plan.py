"""Planning a sweep: every check that would fail each trial the same way, the study opened, and the settings of
the run resolved, once, before any output or trial (:func:`plan_sweep`). The run loop (:func:`sweeper.study.run_study`)
takes the plan as it is; ``sweep run``, the tests and the benchmarks make it the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from sweeper.errors import SpaceError, SweeperError
from sweeper.memory import memory_predictor, nothing_fits, smallest_predicted
from sweeper.space import SearchSpace, TrialConfig
from sweeper.study import redact_url, study_dir
from sweeper.study.writing import (
    CARDS_ATTR,
    LONGEST_SAMPLE_ATTR,
    OWNER_FILE,
    STUDY_ID_ATTR,
    TrialStatus,
    check_disk,
    check_writable,
    choose_setup,
    count_finished,
    default_storage,
    device_kind,
    heartbeat_interval_s,
    in_memory,
    open_study,
    slot_devices,
    sqlite_file,
    storage_of,
    store_baseline,
    stored_calibration,
    stored_setups,
    trial_dir,
    unapplied_settings,
)
from sweeper.sweep._preflight import known_memory, trial_device
from sweeper.sweep._setup_checks import check_setup


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """A sweep ready to run: what :func:`plan_sweep` checked and opened.

    Attributes:
        space: The validated space.
        model_path: The local checkpoint the trials load (:func:`sweeper.model.resolve_model`).
        study: The opened (created or loaded) Optuna study.
        storage: Its storage URL, as given (may hold a password: show it with :func:`sweeper.study.redact_url`).
        name: The study name.
        n_trials: Finished trials the study should hold when done, counted over the whole study.
        timeout_s: Wall-clock budget of this run in seconds, checked between trials; None for no limit.
        workers: Trials run at once by this process (1 to 64), each in its own trial process.
        devices: Per worker slot, its ``CUDA_VISIBLE_DEVICES`` value, or None for this machine's
            (:func:`sweeper.study.slot_devices`); ``len(devices) == workers``.
        finished_before: Finished trials the study held when the plan was made (a resume when ``> 0``).
        predict_peak_gib: The memory model for this space on this machine's trial device
            (:func:`sweeper.memory.memory_predictor`): a trial config to its predicted peak in GiB, uncorrected; None
            where the model's shape is unknown.
        setup: The study's setup this run measures (:func:`sweeper.study._setups.choose_setup`), stored on each of
            its trials; None for a plan made without one (tests that build a plan by hand).
        new_setup: The setup was first recorded by this run, in a study that already held trials.
        unapplied: With nothing to run, the settings of the space that differ from the study's current setup, which
            this run did not record (:func:`sweeper.study._setups.unapplied_settings`): ``key new (measured old)``.
        max_consecutive_repeats: Repeats of measured configurations in a row after which the sweep stops: the
            sampler has nothing new to offer.
        longest_sample_tokens: The data's longest tokenized sample (as the trials tokenize it), None when unknown:
            a configuration's worst step is ``[batch, TrialConfig.worst_case_length(it)]``, which
            ``predict_peak_gib`` predicts, and ``max_seq_length`` values at or above it train the same rows (their
            trials are settled as repeats of each other).
    """

    space: SearchSpace
    model_path: str
    study: optuna.Study
    storage: str
    name: str
    n_trials: int
    timeout_s: float | None
    workers: int
    devices: list[str | None]
    finished_before: int
    predict_peak_gib: Callable[[TrialConfig], float | None]
    setup: int | None = None
    new_setup: bool = False
    unapplied: tuple[str, ...] = ()
    max_consecutive_repeats: int = 25
    longest_sample_tokens: int | None = None

    @property
    def trials_dir(self) -> Path:
        """``studies/<name>/trials/``: each trial's folder (config, result, worker log) is a numbered folder in it."""
        return trial_dir(self.name, 0).parent

    @property
    def is_default_storage(self) -> bool:
        """The study lives in ``sqlite:///studies/<name>.db``: commands can name it by its name alone."""
        return self.storage == default_storage(self.name)


def plan_sweep(
    space: SearchSpace,
    model_path: str,
    *,
    storage: str | None = None,
    name: str | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    workers: int = 1,
    devices: list[str] | None = None,
    refuse_if_nothing_fits: bool = True,
    new_setup: bool = False,
    on_measure: Callable[[str], None] | None = None,
    longest_sample_tokens: int | None = None,
    card: Mapping[str, Any] | None = None,
) -> SweepPlan:
    """Check a sweep's setup and open its study, in this order, stopping at the first problem: the heartbeat
    setting, a storage the workers cannot share, the setup checks of the model and space
    (:func:`sweeper.study.check_setup`), a studies folder that cannot be written or whose disk is full, the storage
    (opened or created: :func:`sweeper.study.open_study`), the settings the study was measured under
    (:func:`sweeper.study._setups.choose_setup`), and whether any configuration is predicted to fit its cap.

    Args:
        space: The validated space.
        model_path: From :func:`sweeper.model.resolve_model`.
        storage: Optuna storage URL; default ``space.study.storage`` or ``sqlite:///studies/<name>.db``.
        name: Study name; default ``space.study.name``.
        n_trials: Default ``space.study.n_trials``; counted over the whole study.
        timeout_s: Default ``space.study.timeout_s``; seconds, checked between trials (a trial has its own timeout).
        workers: Worker slots, 1 to 64.
        devices: ``CUDA_VISIBLE_DEVICES`` values given to the workers in turn (:func:`sweeper.study.slot_devices`).
        refuse_if_nothing_fits: Refuse a space where no configuration is predicted to fit (the memory model corrected
            by what the study measured on this kind of machine), unless the study already holds a trial that fit
            under a cap no larger than this one. False lets each trial be pruned by the preflight instead (for tests
            and benchmarks of the preflight).
        new_setup: ``sweep run --new-setup``: measure settings other than the study's as a new setup of it.
        on_measure: Told one line before the CPU measures the smallest configuration (two uncapped steps, about as
            long as a trial's loading: a cap near the model's prediction, or nothing-fits advice), and one with what
            it measured, so that a wait is never silent.
        longest_sample_tokens: The data's longest tokenized sample (:attr:`SweepPlan.longest_sample_tokens`), None
            when unknown (then each configuration is predicted at its ``max_seq_length``).
        card: The device the trials run on as it was read (``{"device", "name", "total_memory_gib"}``): recorded
            on the study by name (:attr:`sweeper.study.StudySnapshot.cards`), for the report's cap line.

    Raises:
        SpaceError: A setup problem (one line each), an in-memory storage, or nothing fits.
        StudyError: The storage cannot be opened or written, holds another study of that name, or the study was
            measured under other settings and ``new_setup`` is False.
        RunError: The studies folder cannot be written or its disk is full.
    """
    name = name or space.study.name
    url = storage or space.study.storage or default_storage(name)
    target = n_trials or space.study.n_trials
    _check_before_opening(space, model_path, url, name, workers)
    had = _existing(url, name)
    check_writable(study_dir(name))  # before the storage is touched
    study = None
    try:
        study = open_study(space, url, name, target)  # a storage problem is one line before any output
        created = not study.trials and set(study.user_attrs) <= {STUDY_ID_ATTR}
        known, finished = len(stored_setups(study)), count_finished(study)
        setup, unapplied = _setup_of(study, space, url, finished >= target and known > 0, new_setup)
        check_disk(study_dir(name))  # before any trial starts, and again before each
        check = refuse_if_nothing_fits and finished < target  # a run with nothing to run measures nothing
        predict = _checked_predictor(space, model_path, study, check, on_measure, longest_sample_tokens)
    except SweeperError:
        _forget_created(study if study is not None and created else None, url, name, had)
        raise
    if longest_sample_tokens is not None and finished < target:
        study.set_user_attr(LONGEST_SAMPLE_ATTR, longest_sample_tokens)  # what the report says of equal lengths
    if card is not None and finished < target:
        cards = dict(study.user_attrs.get(CARDS_ATTR) or {})
        cards[str(card["name"])] = {"device": card["device"], "total_memory_gib": round(card["total_memory_gib"], 3)}
        study.set_user_attr(CARDS_ATTR, cards)
    return SweepPlan(
        space=space,
        model_path=model_path,
        study=study,
        storage=url,
        name=name,
        n_trials=target,
        timeout_s=timeout_s if timeout_s is not None else space.study.timeout_s,
        workers=workers,
        devices=slot_devices(workers, devices),
        finished_before=finished,
        predict_peak_gib=predict,
        setup=setup,
        new_setup=setup is not None and setup >= known > 0,
        unapplied=tuple(unapplied),
        longest_sample_tokens=longest_sample_tokens,
    )


def _checked_predictor(
    space: SearchSpace,
    model_path: str,
    study: optuna.Study,
    check: bool,
    on_measure: Callable[[str], None] | None,
    longest_sample_tokens: int | None = None,
) -> Callable[[TrialConfig], float | None]:
    """Of :func:`plan_sweep`: the memory model's prediction of a trial's peak on this machine's trial device (its
    worst step on this data: :meth:`TrialConfig.as_trained`), after refusing, when ``check``, a space of which
    nothing is predicted to fit (:func:`_nothing_fits`).

    Raises:
        SpaceError: Nothing fits (one line, with the advice).
    """
    model = memory_predictor(model_path, space.model.name_or_path, space.model.attn_implementation, trial_device())

    def predict(config: TrialConfig) -> float | None:
        return model(config.as_trained(longest_sample_tokens))

    unfit = _nothing_fits(space, predict, study, model_path, on_measure) if check else None
    if unfit:
        raise SpaceError(unfit)
    return predict


def _setup_of(
    study: optuna.Study, space: SearchSpace, url: str, nothing_to_run: bool, new_setup: bool
) -> tuple[int | None, list[str]]:
    """Of :func:`plan_sweep`: the study's setup this run measures under (:func:`choose_setup`), and, when there is
    nothing to run, the current one unchanged with the settings of ``space`` it leaves unapplied
    (:func:`unapplied_settings`): what report and export compare stays as it is."""
    if nothing_to_run:
        return unapplied_settings(study, space)
    return choose_setup(study, space, url, new_setup=new_setup), []


def _check_before_opening(space: SearchSpace, model_path: str, url: str, name: str, workers: int) -> None:
    """What :func:`plan_sweep` refuses before it touches the storage: a bad heartbeat setting, an in-memory storage
    (the sweep would keep nothing), and the setup checks of the model and space (what would fail every trial the
    same way).

    Raises:
        SpaceError, StudyError: One line each.
    """
    heartbeat_interval_s()  # a bad SWEEPER_HEARTBEAT_INTERVAL_S is one line before anything runs
    if in_memory(url):
        raise SpaceError(
            f"{redact_url(url)}: study.storage: an in-memory database keeps nothing after the run (no report, no "
            f"export, no resume); keep the study in a file: leave --storage out (sqlite:///studies/{name}.db) or give "
            f"--storage sqlite:///studies/{name}.db"
        )
    problem = check_setup(space, model_path)
    if problem:
        raise SpaceError(problem)


def _existing(url: str, name: str) -> dict[str, bool]:
    """Whether the SQLite file of ``url`` and the study folder exist, before this run creates them."""
    database = sqlite_file(url)
    return {"database": database is not None and Path(database).exists(), "folder": study_dir(name).exists()}


def _forget_created(study: optuna.Study | None, url: str, name: str, had: dict[str, bool]) -> None:
    """Undo what this refused run created: the study it created (``study``; None when it created none), a
    database file and a study folder that were not there before, so that a refused ``sweep run`` leaves nothing
    ``sweep report`` would list."""
    if study is not None:
        try:
            optuna.delete_study(study_name=name, storage=storage_of(study))
        except Exception:  # the refusal is what the user needs to see; a leftover empty study is harmless
            return
    database = sqlite_file(url)
    if study is not None and database is not None and not had["database"]:
        for leftover in (Path(database), Path(f"{database}.lock")):
            leftover.unlink(missing_ok=True)
    folder = study_dir(name)
    if not had["folder"] and folder.is_dir() and {p.name for p in folder.iterdir()} <= {OWNER_FILE}:
        shutil.rmtree(folder, ignore_errors=True)


#: On the CPU, a cap within this factor of the smallest predicted peak is measured before the first trial: the
#: uncorrected model under-predicted the built-in model's trials by up to 1.7x (0.66 GiB predicted, 1.1 measured), so
#: a cap between the two OOMed every trial (issue 30's case).
CPU_MODEL_ERROR = 2.0


def _nothing_fits(
    space: SearchSpace,
    raw: Callable[[TrialConfig], float | None],
    study: optuna.Study,
    model_path: str,
    on_measure: Callable[[str], None] | None = None,
) -> str | None:
    """One line when no configuration of the space is predicted to fit its cap, by the memory model corrected with
    what the study measured on this kind of machine (:func:`sweeper.memory.nothing_fits`); None when something does,
    or the study already holds a trial that fit under a cap no larger than this run's (a fit under a larger cap, before
    a resume with a smaller ``memory_limit_gib``, says nothing about this one).

    On the CPU, while the study has no correction and no trial that fit, a cap within :data:`CPU_MODEL_ERROR` of the
    smallest predicted peak is checked first: the smallest configuration runs two steps (:func:`measure_smallest`,
    printed through ``on_measure``), and the difference is stored as the study's correction
    (:func:`sweeper.study._calibration.store_baseline`), which the preflight of every trial then applies, until the
    first complete trial's fit replaces it. The advice stands on that measurement too: there the cap binds while the
    model loads, and the process's resident memory (Python and its libraries, the loaded checkpoint) is larger than
    the model's constant for some models (measured on the built-in model: 0.91 GiB while loading, 0.85 GiB training,
    against 0.70 GiB predicted)."""
    kind = device_kind()
    calibration = stored_calibration(study, kind)
    limit_gib = space.base.memory_limit_gib
    known = known_memory(study, kind)
    cpu = trial_device() == "cpu"
    measured: dict[str, tuple[float, float] | None] = {}  # one measurement per sweep, reused

    def measure(config: TrialConfig, why: str) -> tuple[float, float] | None:
        if "smallest" not in measured:
            predicted = raw(config)
            room = machine_available_gib()
            if predicted is None or predicted * CPU_MODEL_ERROR > room:
                # a configuration the model puts beyond what this machine has free is not run to learn its size
                if on_measure is not None and predicted is not None:
                    on_measure(
                        f"memory  {why}; the smallest configuration is predicted at {predicted:.2f} GiB, and up to "
                        f"{CPU_MODEL_ERROR:g}x that is more than this machine has free ({room:.2f} GiB): not "
                        "measured, the advice below is the memory model's"
                    )
                measured["smallest"] = None
                return None
            cap_gib = predicted * CPU_MODEL_ERROR
            if on_measure is not None:
                on_measure(
                    f"memory  {why}; measuring the smallest configuration once (two steps, under {cap_gib:.2f} GiB: "
                    f"{CPU_MODEL_ERROR:g}x its prediction)"
                )
            got = measure_smallest(config, model_path, cap_gib)
            if got is None and on_measure is not None:
                on_measure(
                    f"memory  the measurement did not complete two steps under {cap_gib:.2f} GiB: the smallest "
                    "configuration needs more than that here; the advice below is the memory model's"
                )
            measured["smallest"] = got
        return measured["smallest"]

    if cpu and calibration is None and not any(k.fits for k in known):
        smallest = smallest_predicted(space, raw)
        # the prediction is within the model's CPU error of the cap, either side: measure (one far above it, e.g.
        # 684 GiB at a 2.5 GiB cap, is the nothing-fits line's at once and is never measured)
        if smallest is not None and limit_gib / CPU_MODEL_ERROR <= smallest[0] <= limit_gib * CPU_MODEL_ERROR:
            got = measure(smallest[1], f"the cap is within the CPU memory model's error ({CPU_MODEL_ERROR:g}x) of "
                          f"the smallest predicted peak ({smallest[0]:.2f} GiB)")  # fmt: skip
            if got is not None:
                calibration = store_baseline(study, smallest[1], smallest[0], max(got), kind)
                if on_measure is not None:
                    on_measure(
                        f"memory  measured {max(got):.2f} GiB (loading {got[0]:.2f} GiB) where the model said "
                        f"{smallest[0]:.2f}: the preflight adds the difference until a trial completes"
                    )

    def predict(config: TrialConfig) -> float | None:
        peak = raw(config)
        return calibration.correct(config, peak) if calibration is not None and peak is not None else peak

    def advise(config: TrialConfig) -> tuple[float, float] | None:
        return measure(config, "nothing is predicted to fit; so that the advice holds")

    fit = any(k.fits and k.config.memory_limit_gib <= limit_gib for k in known)
    return nothing_fits(space, predict, known_fit=fit, measure=advise if cpu else None)


def machine_available_gib() -> float:
    """What this machine has free for a measurement, in GiB: ``MemAvailable`` (its physical memory where there is no
    ``/proc/meminfo``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def measure_smallest(config: TrialConfig, model_path: str, cap_gib: float | None = None) -> tuple[float, float] | None:
    """Run ``config`` for two steps without the stress phase, capped at ``cap_gib`` (default: what the machine has
    free), in a fresh trial process: ``(load_peak_memory_gib, peak_memory_gib)``, or None when it did not complete
    them. Two, not one: the optimizer allocates its states in the first step's update, so only the second step's
    backward runs beside them (advice from one step ran out of memory in step 2's backward at 0.63 GiB:
    tests/study/test_setup_checks.py)."""
    from sweeper.trial import run_trial

    cap = min(cap_gib if cap_gib is not None else math.inf, machine_available_gib())
    two = dataclasses.replace(config, max_steps=2, warmup_steps=0, memory_limit_gib=cap, trial_timeout_s=600.0)
    with tempfile.TemporaryDirectory(prefix="sweeper-measure-") as folder:
        result = run_trial(two, folder, model_path=model_path, stress=False)
    if (
        result.memory.peak_memory_gib is None
        or result.memory.load_peak_memory_gib is None
        or result.status != TrialStatus.COMPLETE
    ):
        return None
    return result.memory.load_peak_memory_gib, result.memory.peak_memory_gib
