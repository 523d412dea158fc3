"""One typed, read-only view of a study for every reader (optuna's ``FrozenStudy`` shape): :class:`StudySnapshot`.

A command reads the study once (:func:`snapshot`): its attributes as typed fields, every trial as a
:class:`~sweeper.study.StoredTrial` with its confirmation, its setups, the RUNNING trials no sweep runs any more; the
front, the counts and the current setup's trials are computed from that reading at most once each. The snapshot is
data only: it holds no ``optuna.Study`` and no raw study attributes, so a reader cannot read the storage through it,
and the sweep's loop keeps its own up to date with each trial it tells (:meth:`StudySnapshot.with_trial`) instead of
reading the study again. Report, export, confirm, the dashboard and the sweep's bookkeeping take a snapshot; the
functions here also accept an ``optuna.Study`` (then they read it once for the call).

No study user attribute is read by its string key outside :mod:`sweeper.study`: the keys are here and in the
modules that write them.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import optuna
from optuna.trial import TrialState

from sweeper.stability import LrCalibration, barely_learns, lr_calibration_of
from sweeper.storage import StudyAttr, stale_running
from sweeper.study._confirmation import Confirmation, confirmations_in
from sweeper.study._front import non_dominated, tied_on_stability, ties_on_stability
from sweeper.study._objectives import MEMORY_NOISE_SHARE, Objective, study_objectives
from sweeper.study._pareto import FrontProgress, front_progress
from sweeper.study._setups import differences, stored_setups, trial_setup
from sweeper.study._stored import PredictionError, StoredTrial, prediction_errors_of, stored_trial
from sweeper.trial import TrialStatus


def _int_or_none(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


@dataclass(frozen=True, eq=False)
class StudySnapshot:
    """A study as it was when read: never changes, never reads the storage again.

    Attributes:
        name: The study's name.
        study_id: Its identity (``study_id``), None for a study written before identities.
        objectives: What it ranks by (:func:`sweeper.study.study_objectives`).
        model_path: The local path of the model its trials loaded (a converted GGUF, a checkpoint), None if unknown.
        searched: The keys it searches, in the space file's order.
        confirm_steps: ``study.confirm_steps`` of its space: the long horizon of ``sweep confirm``; None: 10x
            ``max_steps``.
        calibration: The stored memory correction by memory kind (``memory_calibration``), None without one.
        lr_calibration: The study's own factor from ``lr_ceiling`` to ``predicted_max_lr`` (``lr_calibration``,
            written by ``sweep calibrate``), None until it has one; every trial's ``predicted_max_lr`` is computed
            with it.
        trials: Every trial, by number, each with its confirmation.
        confirmations: The confirmations that are outcomes, by trial number.
        setups: The settings of each setup it measured under (:mod:`sweeper.study._setups`).
        current_setup: The index of the setup its latest run measured, None for a study written before setups.
        longest_sample_tokens: The data's longest tokenized sample as the last ``sweep run`` read it
            (:attr:`sweeper.sweep._plan.SweepPlan.longest_sample_tokens`), None when unknown (a study of an older
            version).
        cards: The devices its sweeps ran on, by name: ``(device, total_memory_gib)``; empty for a study of an older
            version or one whose device was never read.
        untrained_rows: The whole dataset file's rows with no supervised token at a ``max_seq_length``, by that
            length, as the last ``sweep run`` read them (``data_untrained_rows``); empty when none or unknown.
        stale_running: Its RUNNING trials that no sweep runs any more, by number, each with the line that says since
            when (:func:`sweeper.storage._recovery.stale_running`), as read.
    """

    name: str
    study_id: str | None
    objectives: tuple[Objective, ...]
    model_path: str | None
    searched: tuple[str, ...]
    confirm_steps: int | None
    calibration: Mapping[str, Any] | None
    lr_calibration: LrCalibration | None
    trials: tuple[StoredTrial, ...]
    confirmations: Mapping[int, Confirmation]
    setups: tuple[Mapping[str, Any], ...]
    current_setup: int | None
    longest_sample_tokens: int | None = None
    cards: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    stale_running: Mapping[int, str] = field(default_factory=dict)
    untrained_rows: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def directions(self) -> list[str]:
        """``minimize``/``maximize`` per objective, in order."""
        return [o.direction for o in self.objectives]

    def trials_in(self, states: Sequence[TrialState] | None = None) -> list[StoredTrial]:
        """The trials in ``states`` (all when None), by number."""
        return list(self.trials) if states is None else [t for t in self.trials if t.state in states]

    @functools.cached_property
    def by_number(self) -> dict[int, StoredTrial]:
        """Every trial by its number."""
        return {t.number: t for t in self.trials}

    @functools.cached_property
    def measured(self) -> list[StoredTrial]:
        """Finished trials that ran a configuration (:attr:`StoredTrial.measured`), by number."""
        return [t for t in self.trials if t.measured]

    @functools.cached_property
    def finished(self) -> int:
        """Trials that count toward ``n_trials`` (:attr:`StoredTrial.counts`)."""
        return sum(1 for t in self.trials if t.counts)

    def setup_of(self, trial: StoredTrial) -> int | None:
        """The setup ``trial`` was measured under (:func:`sweeper.study._setups.trial_setup`)."""
        return trial_setup(trial.user_attrs, trial.config, trial.params, self.setups)

    def current(self, trials: Sequence[StoredTrial]) -> list[StoredTrial]:
        """Those of ``trials`` measured under the current setup: what the front, the picks and the exports compare;
        all of them for a study written before setups."""
        if self.current_setup is None:
            return list(trials)
        return [t for t in trials if self.setup_of(t) == self.current_setup]

    @functools.cached_property
    def front_progress(self) -> FrontProgress | None:
        """How far the latest complete trials of the current setup moved its front (:func:`front_progress`;
        repeats counted once); None with fewer than 6 complete trials."""
        return front_progress([(t.number, t.values or ()) for t in self._complete], self.objectives)

    @functools.cached_property
    def _complete(self) -> list[StoredTrial]:
        """The COMPLETE trials of the current setup with values, a repeat once (as the original)."""
        return [
            t for t in self.current(self.trials_in((TrialState.COMPLETE,))) if not t.is_repeat and t.values is not None
        ]

    @functools.cached_property
    def front(self) -> list[StoredTrial]:
        """The COMPLETE trials of the current setup that no other of them dominates on :attr:`objectives`
        (:func:`sweeper.study._front.non_dominated`), by peak memory; a repeat is listed once, as the original."""
        return non_dominated(self._complete, self.objectives)

    @functools.cached_property
    def best_learning_progress(self) -> float:
        """The largest ``learning_progress`` among the current setup's complete trials (0 without one)."""
        return max(
            (t.result.constant.learning_progress or 0.0 for t in self.current(self.trials) if t.values), default=0.0
        )

    def learning(self, trials: Sequence[StoredTrial]) -> list[StoredTrial]:
        """``trials`` without those that barely learn (:func:`sweeper.stability.barely_learns` against
        :attr:`best_learning_progress`), or all of them when every one does."""
        best = self.best_learning_progress
        return [t for t in trials if not barely_learns(t.result.constant.learning_progress, best)] or list(trials)

    @functools.cached_property
    def status_counts(self) -> dict[str, int]:
        """Trials by :attr:`StoredTrial.count_label`."""
        return dict(Counter(t.count_label for t in self.trials))

    @functools.cached_property
    def nan_causes(self) -> dict[str, list[int]]:
        """Numbers of the NaN trials by ``nan_cause`` (``data``, ``precision``, ``optimization``, ``unknown``),
        repeats left out; causes with no trial omitted."""
        out: dict[str, list[int]] = {"data": [], "precision": [], "optimization": [], "unknown": []}
        for t in self.trials:
            if t.status == TrialStatus.NAN and not t.is_repeat:
                out[t.result.nan.cause or "unknown"].append(t.number)
        return {cause: numbers for cause, numbers in out.items() if numbers}

    def other_setups(self) -> tuple[int, list[tuple[int, list[str] | None]]]:
        """The measured trials of the current setup, and for each other setup holding measured trials: how many,
        and what differs from the current one (:func:`sweeper.study._setups.differences`, ``["the same
        settings"]`` when nothing this version records does), or None when this version cannot tell; ``(n, [])``
        for a study written before setups or without other setups' trials."""
        current, setups = self.current_setup, self.setups
        by_setup: dict[int | None, int] = {}
        for t in self.measured:
            index = self.setup_of(t)
            by_setup[index] = by_setup.get(index, 0) + 1
        if current is None:
            return sum(by_setup.values()), []
        others: list[tuple[int, list[str] | None]] = []
        for index, n in sorted(
            ((i, n) for i, n in by_setup.items() if i != current), key=lambda item: -1 if item[0] is None else item[0]
        ):
            if index is None or index >= len(setups) or current >= len(setups):
                others.append((n, None))
            else:
                others.append((n, differences(setups[current], setups[index], word="now") or ["the same settings"]))
        return by_setup.get(current, 0), others

    def non_dominated(self, trials: Sequence[StoredTrial]) -> list[StoredTrial]:
        """The COMPLETE ``trials`` no other of them dominates on :attr:`objectives`
        (:func:`sweeper.study._front.non_dominated`)."""
        return non_dominated(trials, self.objectives)

    @functools.cached_property
    def prediction_errors(self) -> list[PredictionError]:
        """The memory model's predicted vs measured peak of each measured ``complete`` trial
        (:func:`sweeper.study._stored.prediction_errors_of`)."""
        return prediction_errors_of(self.trials)

    def as_light_within_noise(self, trial: StoredTrial, than: StoredTrial) -> bool:
        """Whether ``trial``'s peak memory is at most ``than``'s plus the seed's noise on it
        (:data:`~sweeper.study._objectives.MEMORY_NOISE_SHARE`, 10%)."""
        memory = next(i for i, o in enumerate(self.objectives) if o.role == "memory")
        if trial.values is None or than.values is None:
            return False
        return trial.values[memory] <= than.values[memory] * (1 + MEMORY_NOISE_SHARE)

    def tied_on_stability(self, trial: StoredTrial, others: Sequence[StoredTrial]) -> list[int]:
        """The numbers of ``others`` whose stability interval overlaps ``trial``'s on :attr:`objectives`
        (:func:`sweeper.study._front.tied_on_stability`): their difference is within the noise."""
        return tied_on_stability(trial, others, self.objectives)

    def ties_on_stability(self, trials: Sequence[StoredTrial], others: Sequence[StoredTrial]) -> list[list[int]]:
        """:meth:`tied_on_stability` for each of ``trials``, all pairs at once
        (:func:`sweeper.study._front.ties_on_stability`)."""
        return ties_on_stability(trials, others, self.objectives)

    def with_trial(self, trial: optuna.trial.FrozenTrial) -> StudySnapshot:
        """This snapshot with ``trial`` added or replaced (the loop's update after it tells a trial), its cached views
        computed afresh; the study's attributes are as read."""
        stored = stored_trial(trial, self.confirmations.get(trial.number), self.lr_calibration, self.confirm_steps)
        trials = {t.number: t for t in self.trials}
        trials[trial.number] = stored
        return replace(self, trials=tuple(trials[n] for n in sorted(trials)))


def _cards(raw: Any) -> dict[str, tuple[str, float]]:
    """The ``cards`` study attribute, typed: ``{name: (device, total_memory_gib)}``; what is not one is left out."""
    out: dict[str, tuple[str, float]] = {}
    for name, card in raw.items() if isinstance(raw, dict) else ():
        total = card.get("total_memory_gib") if isinstance(card, dict) else None
        if isinstance(total, (int, float)) and not isinstance(total, bool):
            out[str(name)] = (str(card.get("device", "cuda")), float(total))
    return out


def _untrained(raw: Any) -> dict[int, tuple[int, ...]]:
    """The ``data_untrained_rows`` study attribute, typed: ``{max_seq_length: rows}``; what is not one is left out."""
    out: dict[int, tuple[int, ...]] = {}
    for length, rows in raw.items() if isinstance(raw, dict) else ():
        if str(length).isdigit() and isinstance(rows, list) and all(isinstance(r, int) for r in rows):
            out[int(length)] = tuple(rows)
    return out


#: What the readers take: a snapshot (read nothing) or a study (read once for the call).
StudyLike: TypeAlias = optuna.Study | StudySnapshot


def _make(
    study: optuna.Study,
    attrs: Mapping[str, Any],
    trials: tuple[StoredTrial, ...],
    setups: tuple[Mapping[str, Any], ...],
    stale: bool = True,
) -> StudySnapshot:
    """The snapshot of ``study`` from its attributes, trials and setups as just read; ``stale``: look for RUNNING
    trials no sweep runs any more (a heartbeat query when one is RUNNING)."""
    searched = attrs.get(StudyAttr.SEARCHED)
    calibration = attrs.get(StudyAttr.MEMORY_CALIBRATION)
    model_path = attrs.get(StudyAttr.MODEL_PATH)
    study_id = attrs.get(StudyAttr.STUDY_ID)
    return StudySnapshot(
        name=study.study_name,
        study_id=study_id if isinstance(study_id, str) and study_id else None,
        objectives=study_objectives(study),
        model_path=str(model_path) if model_path else None,
        searched=tuple(str(k) for k in searched) if isinstance(searched, (list, tuple)) else (),
        confirm_steps=_int_or_none(attrs.get(StudyAttr.CONFIRM_STEPS)),
        calibration=calibration if isinstance(calibration, Mapping) else None,
        lr_calibration=lr_calibration_of(attrs.get(StudyAttr.LR_CALIBRATION)),
        trials=trials,
        confirmations=confirmations_in(attrs),
        setups=setups,
        current_setup=_int_or_none(attrs.get(StudyAttr.CURRENT_SETUP)),
        longest_sample_tokens=_int_or_none(attrs.get(StudyAttr.LONGEST_SAMPLE_TOKENS)),
        cards=_cards(attrs.get(StudyAttr.CARDS)),
        untrained_rows=_untrained(attrs.get(StudyAttr.UNTRAINED_ROWS)),
        stale_running=stale_running(study, [t.frozen for t in trials if t.frozen is not None]) if stale else {},
    )


def snapshot(study: StudyLike, *, stale: bool = True, horizon_steps: int | None = None) -> StudySnapshot:
    """Read ``study`` once: its attributes, every trial with its confirmation, its setups; a snapshot is returned as
    it is (readers pass the one their command built). ``stale`` False leaves :attr:`StudySnapshot.stale_running`
    empty: the sweep's loop fails stale trials itself (:func:`sweeper.storage.fail_stale_trials`) and skips the
    heartbeat query its read would make. ``horizon_steps``: the run length every trial's chance of diverging, its
    call and its safe rate are for (``sweep report``/``export --horizon``: the user's run); None: the study's
    ``confirm_steps``, else 400.

    Raises:
        ValueError: ``horizon_steps`` is given with a snapshot (its figures are derived already), or below 1.
    """
    if horizon_steps is not None and (isinstance(horizon_steps, bool) or horizon_steps < 1):
        raise ValueError(f"horizon_steps must be at least 1, but got {horizon_steps!r}")
    if isinstance(study, StudySnapshot):
        if horizon_steps is not None:
            raise ValueError("a snapshot's figures are derived already: give horizon_steps with the study")
        return study
    attrs = dict(study.user_attrs)
    confirmed = confirmations_in(attrs)
    lr_calibration = lr_calibration_of(attrs.get(StudyAttr.LR_CALIBRATION))
    horizon = horizon_steps or _int_or_none(attrs.get(StudyAttr.CONFIRM_STEPS))
    trials = tuple(
        stored_trial(t, confirmed.get(t.number), lr_calibration, horizon) for t in study.get_trials(deepcopy=False)
    )
    return _make(study, attrs, trials, tuple(stored_setups(study)), stale)


# -- The readers' functions: each takes a snapshot (no reading) or a study (read once for the call) ---------------


def stored_trials(study: StudyLike, states: tuple[TrialState, ...] | None = None) -> list[StoredTrial]:
    """Every trial (or those in ``states``) as :class:`StoredTrial`, by number, with its confirmation."""
    return snapshot(study).trials_in(states)


def confirmations(study: StudyLike) -> dict[int, Confirmation]:
    """Every confirmation that is an outcome of the configuration, by trial number
    (:func:`sweeper.study._confirmation.confirmations_in`)."""
    return dict(snapshot(study).confirmations)


def count_finished(study: StudyLike) -> int:
    """Trials that count toward ``n_trials`` (:attr:`StoredTrial.counts`)."""
    return snapshot(study).finished


def pareto_front(study: StudyLike) -> list[StoredTrial]:
    """The front of the current setup's COMPLETE trials (:attr:`StudySnapshot.front`)."""
    return list(snapshot(study).front)


def status_counts(study: StudyLike) -> dict[str, int]:
    """Trials by :attr:`StoredTrial.count_label` (``running``, ``waiting``, ``repeated``, ``interrupted``, else
    the status)."""
    return dict(snapshot(study).status_counts)


def nan_causes(study: StudyLike) -> dict[str, list[int]]:
    """Numbers of the NaN trials by cause (:attr:`StudySnapshot.nan_causes`)."""
    return dict(snapshot(study).nan_causes)
