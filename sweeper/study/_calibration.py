"""The study's side of the preflight that learns the machine (the fit is :mod:`sweeper.memory`'s
:class:`~sweeper.memory.Calibration`): the measured points among a study's trials, the fit stored as the study user
attribute ``memory_calibration`` (one entry per memory kind: ``cpu_peak_rss``, ``cuda_max_reserved``) so a resumed
sweep and a sweep on another machine start from it, and the predicted-vs-measured rows of the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping

import optuna

from sweeper.devices import device_kind
from sweeper.memory import BASELINE_NUMBER, Calibration, CalibrationPoint, fit_calibration, group_of
from sweeper.space import TrialConfig
from sweeper.storage import StudyAttr
from sweeper.study._snapshot import StudyLike, StudySnapshot, snapshot, stored_trials
from sweeper.study._stored import PredictionError, StoredTrial, TrialStatus


def calibration_points(
    trials: Iterable[StoredTrial], predict: Callable[[TrialConfig], float | None], kind: str
) -> list[CalibrationPoint]:
    """The ``complete`` trials of memory kind ``kind`` with a measured peak among ``trials`` (e.g.
    :func:`sweeper.study.stored_trials` of a study), repeats left out, in their order; ``predict`` gives the memory
    model's prediction of a stored config (None when unknown: the trial is left out)."""
    out = []
    for t in trials:
        if t.is_repeat or t.status != TrialStatus.COMPLETE or t.config is None:
            continue
        measured = t.result.memory.peak_memory_gib
        if t.result.memory.memory_kind != kind or measured is None or not math.isfinite(measured) or measured <= 0:
            continue
        predicted = predict(t.config)
        if predicted is None or not math.isfinite(predicted) or predicted <= 0:
            continue
        out.append(
            CalibrationPoint(
                number=t.number,
                group=group_of(t.config),
                predicted_gib=predicted,
                measured_gib=measured,
            )
        )
    return out


def stored_calibration(study: StudyLike, kind: str | None = None) -> Calibration | None:
    """The correction stored on the study (or as a snapshot read it) for memory kind ``kind`` (None: this machine's,
    :func:`device_kind`), or None when it has none."""
    kind = device_kind() if kind is None else kind
    data = study.calibration if isinstance(study, StudySnapshot) else study.user_attrs.get(StudyAttr.MEMORY_CALIBRATION)
    if not isinstance(data, Mapping) or not isinstance(data.get(kind), Mapping):
        return None
    return Calibration.from_dict(kind, data[kind])


def update_calibration(
    study: optuna.Study,
    predict: Callable[[TrialConfig], float | None],
    kind: str,
    view: StudySnapshot | None = None,
) -> Calibration | None:
    """Fit the correction again from every measured trial of ``kind`` and store it on the study (the other kinds'
    entries are kept). Several sweeps may do this at once: each fits all the trials it sees, so the last write holds
    at least the trials the others saw when they wrote. ``view``: the study as just read (the loop's, after the trial
    was told), else it is read here.

    Returns:
        The stored correction, or None when the study has no point yet (nothing is stored then).
    """
    fitted = fit_calibration(calibration_points(stored_trials(view or study), predict, kind), kind)
    if fitted is None:
        return None
    data = study.user_attrs.get(StudyAttr.MEMORY_CALIBRATION)
    stored = dict(data) if isinstance(data, Mapping) else {}
    stored[kind] = fitted.to_dict()
    study.set_user_attr(StudyAttr.MEMORY_CALIBRATION, stored)
    return fitted


def store_baseline(
    study: optuna.Study, config: TrialConfig, predicted_gib: float, measured_gib: float, kind: str
) -> Calibration:
    """Store, as the study's correction for ``kind`` while no trial has measured one, a single measured point: one
    step of ``config`` (the space's smallest configuration) peaked at ``measured_gib`` where the memory model said
    ``predicted_gib``. Its group is corrected by the offset (``measured = (measured_gib - predicted_gib) + 1 x
    predicted``: on the CPU the model's error there is the process's own resident memory, a fixed amount), the other
    groups by the ratio. The first complete trial's fit (:func:`update_calibration`) replaces it.

    Returns:
        The stored correction.
    """
    point = CalibrationPoint(
        number=BASELINE_NUMBER, group=group_of(config), predicted_gib=predicted_gib, measured_gib=measured_gib
    )
    fitted = fit_calibration([point], kind)
    assert fitted is not None  # one point
    fitted = dataclasses.replace(fitted, lines={point.group: (measured_gib - predicted_gib, 1.0)})
    data = study.user_attrs.get(StudyAttr.MEMORY_CALIBRATION)
    stored = dict(data) if isinstance(data, Mapping) else {}
    stored[kind] = fitted.to_dict()
    study.set_user_attr(StudyAttr.MEMORY_CALIBRATION, stored)
    return fitted


def prediction_errors(study: StudyLike) -> list[PredictionError]:
    """Predicted vs measured for each measured ``complete`` trial of ``study``
    (:attr:`sweeper.study.StudySnapshot.prediction_errors`)."""
    return snapshot(study).prediction_errors
