"""Planning a sweep: every check that would fail each trial the same way, the study opened, and the settings of
the run resolved, once, before any output or trial (:func:`plan_sweep`). The run loop
(:func:`sweeper.sweep._loop.run_study`) takes the plan as it is; ``sweep run``, the tests and the benchmarks make it the
same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import optuna

from sweeper.errors import SpaceError, SweeperError
from sweeper.memory import memory_predictor
from sweeper.space import SearchSpace, TrialConfig
from sweeper.storage import (
    BeforeRun,
    StudyAttr,
    check_disk,
    check_storage_url,
    check_writable,
    default_storage,
    study_dir,
    trial_dir,
)
from sweeper.study import open_study, run_setup, snapshot
from sweeper.sweep._fits import nothing_fits_line
from sweeper.sweep._preflight import trial_device
from sweeper.sweep._setup_checks import check_setup
from sweeper.sweep._slots import slot_devices

if TYPE_CHECKING:
    from sweeper.data import FileLengths


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """A sweep ready to run: what :func:`plan_sweep` checked and opened.

    Attributes:
        space: The validated space.
        model_path: The local checkpoint the trials load (:func:`sweeper.model.resolve_model`).
        study: The opened (created or loaded) Optuna study.
        storage: Its storage URL, as given (may hold a password: show it with :func:`sweeper.storage._urls.redact_url`).
        name: The study name.
        n_trials: Finished trials the study should hold when done, counted over the whole study.
        timeout_s: Wall-clock budget of this run in seconds, checked between trials; None for no limit.
        workers: Trials run at once by this process (1 to 64), each in its own trial process.
        devices: Per worker slot, its ``CUDA_VISIBLE_DEVICES`` value, or None for this machine's
            (:func:`sweeper.sweep._slots.slot_devices`); ``len(devices) == workers``.
        finished_before: Finished trials the study held when the plan was made (a resume when ``> 0``).
        predict_peak_gib: The memory model for this space on this machine's trial device
            (:func:`sweeper.memory.memory_predictor`): a trial config to its predicted peak in GiB, uncorrected; None
            where the model's shape is unknown.
        setup: The study's setup this run measures (:func:`sweeper.study.run_setup`), stored on each of
            its trials; None for a plan made without one (tests that build a plan by hand).
        new_setup: The setup was first recorded by this run, in a study that already held trials.
        unapplied: With nothing to run, the settings of the space that differ from the study's current setup, which
            this run did not record (:func:`sweeper.study.run_setup`): ``key new (measured old)``.
        max_consecutive_repeats: Repeats of measured configurations in a row after which the sweep stops: the
            sampler has nothing new to offer.
        longest_sample_tokens: The data's longest tokenized sample (as the trials tokenize it), None when unknown:
            a configuration's worst step is ``[batch, TrialConfig.worst_case_length(it)]``, which
            ``predict_peak_gib`` predicts, and ``max_seq_length`` values at or above it train the same rows (their
            trials are settled as repeats of each other).
        file_lengths: The whole dataset file's sample lengths (:class:`sweeper.data.FileLengths`), None when
            unknown: when ``dataset.max_samples`` sampled fewer rows, each trial's worst-case step is built from the
            file's longest rows (:meth:`worst_case_samples`), which the exports train; a packed configuration is
            predicted at most at the file's tokens.
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
    file_lengths: FileLengths | None = None

    def worst_case_samples(self, config: TrialConfig) -> list[list[int]] | None:
        """The dataset indices of the whole file's worst step for ``config`` (:meth:`sweeper.data.FileLengths.
        worst_step`), a row at a time; None when the trials' own rows are the file's."""
        if self.file_lengths is None:
            return None
        return self.file_lengths.trial_worst_step(
            config.max_seq_length, config.per_device_train_batch_size, config.packing
        )

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
    file_lengths: FileLengths | None = None,
    card: Mapping[str, Any] | None = None,
) -> SweepPlan:
    """Check a sweep's setup and open its study, in this order, stopping at the first problem: the heartbeat
    setting, a storage the workers cannot share, the setup checks of the model and space
    (:func:`sweeper.sweep._setup_checks.check_setup`), a studies folder that cannot be written or whose disk is full,
    the storage (opened or created: :func:`sweeper.study.open_study`), the settings the study was measured under
    (:func:`sweeper.study.run_setup`), and whether any configuration is predicted to fit its cap.

    Args:
        space: The validated space.
        model_path: From :func:`sweeper.model.resolve_model`.
        storage: Optuna storage URL; default ``space.study.storage`` or ``sqlite:///studies/<name>.db``.
        name: Study name; default ``space.study.name``.
        n_trials: Default ``space.study.n_trials``; counted over the whole study.
        timeout_s: Default ``space.study.timeout_s``; seconds, checked between trials (a trial has its own timeout).
        workers: Worker slots, 1 to 64.
        devices: ``CUDA_VISIBLE_DEVICES`` values given to the workers in turn
            (:func:`sweeper.sweep._slots.slot_devices`).
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
        file_lengths: The whole file's sample lengths (:attr:`SweepPlan.file_lengths`), None when unknown.
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
    check = refuse_if_nothing_fits
    data_tokens = file_lengths.tokens if file_lengths is not None else None
    study, opened = _open_checked(
        space, model_path, url, name, target, new_setup, check, on_measure, longest_sample_tokens, data_tokens
    )
    if opened.finished < target:
        _record_inputs(study, longest_sample_tokens, card)
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
        finished_before=opened.finished,
        predict_peak_gib=opened.predict,
        setup=opened.setup,
        new_setup=opened.setup is not None and opened.setup >= opened.known > 0,
        unapplied=tuple(opened.unapplied),
        longest_sample_tokens=longest_sample_tokens,
        file_lengths=file_lengths,
    )


class _Opened(NamedTuple):
    """What :func:`_open_checked` found: the setups the study knew, its finished trials, the setup this run
    measures and the settings it could not apply, and the checked memory predictor."""

    known: int
    finished: int
    setup: int | None
    unapplied: list[str]
    predict: Callable[[TrialConfig], float | None]


def _open_checked(
    space: SearchSpace,
    model_path: str,
    url: str,
    name: str,
    target: int,
    new_setup: bool,
    refuse_if_nothing_fits: bool,
    on_measure: Callable[[str], None] | None,
    longest_sample_tokens: int | None,
    data_tokens: int | None = None,
) -> tuple[optuna.Study, _Opened]:
    """Of :func:`plan_sweep`: open (or create) the study and run the checks that need it; a study this call created
    is removed again when a check fails, so that bad input leaves nothing behind."""
    before = BeforeRun.of(url, name)
    check_writable(study_dir(name))  # before the storage is touched
    study = None
    try:
        study = open_study(space, url, name, target)  # a storage problem is one line before any output
        created = not study.trials and set(study.user_attrs) <= {StudyAttr.STUDY_ID}
        finished = snapshot(study, stale=False).finished
        known, setup, unapplied = run_setup(study, space, url, finished=finished, target=target, new_setup=new_setup)
        check_disk(study_dir(name), storage=url)  # before any trial starts, and again before each
        check = refuse_if_nothing_fits and finished < target  # a run with nothing to run measures nothing
        predict = _checked_predictor(space, model_path, study, check, on_measure, longest_sample_tokens, data_tokens)
    except SweeperError:
        before.forget(study if study is not None and created else None)
        raise
    return study, _Opened(known, finished, setup, list(unapplied), predict)


def _record_inputs(study: optuna.Study, longest_sample_tokens: int | None, card: Mapping[str, Any] | None) -> None:
    """Record on the study what this run read of its inputs: the data's longest sample (what the report says of
    lengths that train the same rows) and the device by name (the report's cap line)."""
    if longest_sample_tokens is not None:
        study.set_user_attr(StudyAttr.LONGEST_SAMPLE_TOKENS, longest_sample_tokens)
    if card is not None:
        cards = dict(study.user_attrs.get(StudyAttr.CARDS) or {})
        cards[str(card["name"])] = {"device": card["device"], "total_memory_gib": round(card["total_memory_gib"], 3)}
        study.set_user_attr(StudyAttr.CARDS, cards)


def _checked_predictor(
    space: SearchSpace,
    model_path: str,
    study: optuna.Study,
    check: bool,
    on_measure: Callable[[str], None] | None,
    longest_sample_tokens: int | None = None,
    data_tokens: int | None = None,
) -> Callable[[TrialConfig], float | None]:
    """Of :func:`plan_sweep`: the memory model's prediction of a trial's peak on this machine's trial device (its
    worst step on this data: :meth:`TrialConfig.as_trained`), after refusing, when ``check``, a space of which
    nothing is predicted to fit (:func:`nothing_fits_line`).

    Raises:
        SpaceError: Nothing fits (one line, with the advice).
    """
    model = memory_predictor(model_path, space.model.name_or_path, space.model.attn_implementation, trial_device())

    def predict(config: TrialConfig) -> float | None:
        return model(config.as_trained(longest_sample_tokens, data_tokens))

    unfit = nothing_fits_line(space, predict, study, model_path, on_measure) if check else None
    if unfit:
        raise SpaceError(unfit)
    return predict


def _check_before_opening(space: SearchSpace, model_path: str, url: str, name: str, workers: int) -> None:
    """What :func:`plan_sweep` refuses before it touches the storage: a bad heartbeat setting, an in-memory storage
    (the sweep would keep nothing), and the setup checks of the model and space (what would fail every trial the
    same way).

    Raises:
        SpaceError, StudyError: One line each.
    """
    check_storage_url(url, name)
    problem = check_setup(space, model_path)
    if problem:
        raise SpaceError(problem)
