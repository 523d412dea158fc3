"""What a finished study says, as records: the Pareto front with every trial around it, the fit map of batch size
against ``max_seq_length``, loss and gradient-norm curves, parameter importance, and the JSON of ``sweep report``.

The data half of the report: every function takes a study's snapshot (:func:`sweeper.study.snapshot`) and
returns the frozen records of :mod:`sweeper.report._records`, no torch and no plotly;
:mod:`sweeper.report._figures` turns them into figures, :mod:`sweeper.report._console` into text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from optuna.trial import TrialState

from sweeper.memory import median_abs
from sweeper.report._analysis_records import Curve, CurveKind, FitCell, FitMap, MemoryPrediction
from sweeper.report._console import status_label
from sweeper.report._front_text import other_setups_line
from sweeper.report._importance import importance_data
from sweeper.report._picks_data import pick_choices, pick_lines, pick_outcomes, picked_off_front, picks
from sweeper.report._records import FrontData, FrontRow, Report, TrialRecord
from sweeper.study import Objective, StoredTrial, StudySnapshot
from sweeper.trial import TrialStatus

#: Per-trial settings shown in the report and its hover texts (``lora_alpha`` is derived: ``lora_alpha_ratio * r``).
REPORT_KEYS = (
    "r",
    "lora_alpha",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_use_double_quant",
    "bnb_4bit_quant_type",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "learning_rate",
)


def trial_params(trial: StoredTrial, searched: Sequence[str] = ()) -> dict[str, Any]:
    """The trial's settings under :data:`REPORT_KEYS` plus any other searched key, from its stored config; a trial
    that stored none (interrupted before its result was recorded) shows the values it was sampled with."""
    if trial.config is None:
        return dict(trial.params)
    config = trial.config.to_dict()
    out = {k: config[k] for k in REPORT_KEYS if k in config}
    out["lora_alpha"] = trial.lora_alpha
    for key in searched:
        if key not in out and key in config:
            out[key] = config[key]
    return {k: out[k] for k in [*REPORT_KEYS, *searched] if k in out}


def trial_label(trial: StoredTrial) -> str:
    """``complete``, ``oom``, ``nan/data`` ...: the trial's status with its NaN cause (as the console shows it)."""
    return status_label(trial.status_name, trial.result.nan.cause)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def trial_record(
    trial: StoredTrial, searched: Sequence[str], front: set[int], objectives: Sequence[Objective] = ()
) -> TrialRecord:
    """One trial for the report (:class:`~sweeper.report._records.TrialRecord`): number, state, status (with
    cause), reason, params, measurements, front flag, and the value of each objective of ``objectives`` not already
    among them (a registered objective beyond the default ones: :func:`extra_objectives`), None unless the trial
    completed."""
    r = trial.result
    extra = extra_objectives(objectives)
    complete = trial.state == TrialState.COMPLETE
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        status=trial.stored_status,
        label=trial_label(trial),
        nan_cause=r.nan.cause,
        nan_samples=tuple(r.nan.samples or ()),
        reason=r.reason,
        params=trial_params(trial, searched),
        peak_memory_gib=_finite(r.memory.peak_memory_gib),
        memory_kind=r.memory.memory_kind,
        predicted_peak_gib=_finite(r.memory.predicted_peak_gib),
        instability=_finite(r.constant.instability) if complete else None,
        stability=trial.stability if complete else dataclasses.replace(trial.stability, stability_margin=None),
        learning_progress=_finite(r.constant.learning_progress),
        fail_step=r.fail_step,
        steps_done=r.constant.steps_done,
        on_front=trial.number in front,
        confirmation=trial.confirmation,
        objective_values={
            o.name: trial.values[i] if trial.values is not None else None
            for i, o in enumerate(objectives)
            if o in extra
        },
        phase_peak_memory_gib=dict(r.memory.phase_peak_memory_gib or {}),
        worst_case_shape=r.memory.worst_case_shape,
    )


def extra_objectives(objectives: Sequence[Objective]) -> list[Objective]:
    """The objectives of ``objectives`` that the report's rows do not already show as a measurement: those with no
    role (neither the memory nor the stability objective), e.g. a registered third objective."""
    return [o for o in objectives if o.role is None]


def front_data(study: StudySnapshot) -> FrontData:
    """Every measured trial of the study's current setup (:meth:`sweeper.study.StudySnapshot.current`) as a point of
    peak memory against its stability margin, the front flagged (:class:`~sweeper.report._records.FrontData`).

    Its ``objectives`` are the study's (``peak_memory_gib``, ``edge_proximity``, or ``instability`` second in a study
    written before the margin). PRUNED and FAIL trials have ``stability_margin`` and ``instability`` None and, where
    the worker measured it, a ``peak_memory_gib`` (an OOM's is the memory at the failure).
    """
    front = {t.number for t in study.front}
    current = study.current(study.measured)  # other setups' trials are not on this front's axes
    points = tuple(trial_record(t, study.searched, front, study.objectives) for t in current)
    kinds = {p.memory_kind for p in points if p.memory_kind}
    limits = [t.config.memory_limit_gib for t in current if t.config is not None]
    return FrontData(
        objectives=tuple(objectives_of(study)),
        memory_kind=kinds.pop() if len(kinds) == 1 else None,
        memory_limit_gib=max(limits) if limits else None,
        picks=picks(study),
        points=points,
        cards=study.cards,
    )


def counts_with_stale(study: StudySnapshot) -> dict[str, int]:
    """:func:`sweeper.study._snapshot.status_counts`, with the RUNNING trials that no sweep runs any more
    (:func:`sweeper.storage._recovery.stale_running`) counted as ``stale`` instead of ``running``."""
    counts = dict(study.status_counts)
    stale = len(study.stale_running)
    if stale:
        counts["running"] = counts.get("running", 0) - stale
        if counts["running"] <= 0:
            del counts["running"]
        counts["stale"] = stale
    return counts


def objectives_of(study: StudySnapshot) -> list[str]:
    """The names of the study's objectives in order (:func:`sweeper.study.study_objectives`):
    ``peak_memory_gib`` and its stability objective, then any other it was created with."""
    return [o.name for o in study.objectives]


def fit_map_data(study: StudySnapshot) -> FitMap:
    """Which ``per_device_train_batch_size`` x ``max_seq_length`` shapes fit the memory cap
    (:class:`~sweeper.report._analysis_records.FitMap`).

    A cell *fits* when some trial of that shape ran a step within the cap (``complete`` or ``nan``), is *oom* when
    every trial of that shape ran out of memory, and is *not tried* otherwise (the figure fills those in). Other
    settings (r, dtype, ...) differ between the trials of a cell: its measured peaks are given as a range.
    """
    fits: dict[tuple[int, int], int] = {}
    ooms: dict[tuple[int, int], int] = {}
    trials: dict[tuple[int, int], list[int]] = {}
    peaks: dict[tuple[int, int], list[float]] = {}
    for t in study.measured:
        config, fit = t.config, t.status.fits
        if fit is None or config is None:
            continue
        key = (config.per_device_train_batch_size, config.max_seq_length)
        trials.setdefault(key, []).append(t.number)
        (fits if fit else ooms)[key] = (fits if fit else ooms).get(key, 0) + 1
        peak = _finite(t.result.memory.peak_memory_gib)
        if peak is not None and fit:
            peaks.setdefault(key, []).append(peak)
    limits = [t.config.memory_limit_gib for t in study.measured if t.config is not None]
    kinds = {t.result.memory.memory_kind for t in study.measured if t.config is not None}
    cells = []
    for key in sorted(trials):
        shape_peaks = peaks.get(key, [])
        cells.append(
            FitCell(
                per_device_train_batch_size=key[0],
                max_seq_length=key[1],
                fits=fits.get(key, 0),
                ooms=ooms.get(key, 0),
                trials=tuple(trials[key]),
                state="fits" if fits.get(key) else "oom",
                min_peak_memory_gib=min(shape_peaks) if shape_peaks else None,
                max_peak_memory_gib=max(shape_peaks) if shape_peaks else None,
            )
        )
    return FitMap(
        batch_sizes=tuple(sorted({k[0] for k in trials})),
        max_seq_lengths=tuple(sorted({k[1] for k in trials})),
        cells=tuple(cells),
        memory_limit_gib=max(limits) if limits else None,
        cpu="cpu_peak_rss" in kinds,
    )


def largest_fitting_seq(fit_map: FitMap) -> dict[int, int | None]:
    """The largest ``max_seq_length`` that fit for each batch size of :func:`fit_map_data` (None: none fit)."""
    out: dict[int, int | None] = {}
    for b in fit_map.batch_sizes:
        fits = [c.max_seq_length for c in fit_map.cells if c.per_device_train_batch_size == b and c.state == "fits"]
        out[b] = max(fits) if fits else None
    return out


def describe_fit(fit_map: FitMap) -> dict[int, str]:
    """Per batch size, the largest ``max_seq_length`` that fit, or which lengths ran out of memory: ``{1: "256",
    8: "none (OOM at 128, 256)"}``."""
    out = {}
    for b, seq in largest_fitting_seq(fit_map).items():
        if seq is not None:
            out[b] = str(seq)
        else:
            ooms = sorted(c.max_seq_length for c in fit_map.cells if c.per_device_train_batch_size == b)
            out[b] = f"none (OOM at {', '.join(map(str, ooms))})"
    return out


def curves_data(study: StudySnapshot) -> list[Curve]:
    """Loss and gradient-norm curves (:class:`~sweeper.report._analysis_records.Curve`) of the front's trials, of the
    NaN trials (up to the failing step, whose non-finite values are None) and of the diverged trials, in that order."""
    front = study.front
    numbers = {t.number for t in front}
    nan = [t for t in study.measured if t.status_name == TrialStatus.NAN and t.number not in numbers]
    diverged = [t for t in study.measured if t.status_name == TrialStatus.DIVERGED and t.number not in numbers]
    groups: tuple[tuple[CurveKind, list[StoredTrial]], ...] = (("front", front), ("nan", nan), ("diverged", diverged))
    return [
        Curve(
            number=t.number,
            kind=kind,
            label=f"#{t.number} {trial_label(t)}",
            loss=tuple(_finite(x) for x in t.result.constant.loss_trace),
            grad_norm=tuple(_finite(x) for x in t.result.constant.grad_norm_trace),
        )
        for kind, trials in groups
        for t in trials
    ]


def memory_prediction_data(study: StudySnapshot) -> MemoryPrediction:
    """Predicted vs measured peak memory of the complete trials, as the preflight predicted each before running it
    (:attr:`sweeper.study.StudySnapshot.prediction_errors`; :class:`~sweeper.report._records.MemoryPrediction`).
    Errors are fractions of the measured peak (``-0.33``: a third under); the medians are of their absolute values,
    ``median_corrected_error`` over the trials that had a correction (``corrected_trials`` of them);
    ``calibration`` is the study's stored correction (:attr:`sweeper.storage.StudyAttr.MEMORY_CALIBRATION`, by
    memory kind), or None."""
    rows = study.prediction_errors
    corrected = [r.corrected_error for r in rows if r.corrected_error is not None]
    return MemoryPrediction(
        trials=tuple(rows),
        median_error=median_abs(r.error for r in rows),
        median_corrected_error=median_abs(corrected),
        corrected_trials=len(corrected),
        calibration=study.calibration,
    )


def front_row(
    trial: StoredTrial,
    searched: Sequence[str],
    objectives: Sequence[Objective],
    tied_with: Sequence[int] = (),
) -> FrontRow:
    """One COMPLETE trial of the front as ``sweep report --json`` lists it (:class:`~sweeper.report._records.FrontRow`),
    and the numbers of the trials shown beside it (the front and the picks off it, :func:`picked_off_front`) it is
    tied with on stability (``tied_with``: :meth:`sweeper.study.StudySnapshot.tied_on_stability`).

    Raises:
        ValueError: ``trial`` has no objective values (it did not complete).
    """
    if trial.values is None:
        raise ValueError(f"trial {trial.number} has no objective values")
    values = dict(zip((o.name for o in objectives), trial.values))
    memory = next((i for i, o in enumerate(objectives) if o.role == "memory"), 0)
    r = trial.result
    return FrontRow(
        number=trial.number,
        params=trial_params(trial, searched),
        objective_values=values,
        peak_memory_gib=trial.values[memory],
        stability=trial.stability,
        learning_progress=_finite(r.constant.learning_progress),
        instability=_finite(r.constant.instability),
        confirmation=trial.confirmation,
        tied_with=tuple(tied_with),
    )


def report_data(study: StudySnapshot) -> Report:
    """What ``sweep report --json`` prints (:meth:`~sweeper.report._records.Report.to_dict`) and the HTML report
    shows: the front (:func:`front_row`), every measured trial and every stale running one (a sweep killed midway;
    :func:`sweeper.storage._recovery.stale_running`) (:func:`trial_record`), counts, NaN causes, what fit,
    importance, picks, memory predictions (:func:`memory_prediction_data`) and the line on other setups
    (:func:`sweeper.report._front_text.other_setups_line`, or None)."""
    front = study.front
    numbers = {t.number for t in front}
    outcomes = pick_outcomes(study)
    chosen = pick_choices(outcomes)
    shown = [*front, *picked_off_front(study, {name: c.chosen().number for name, c in chosen.items()})]
    stale = study.stale_running
    listed = sorted([*study.measured, *(t for t in study.trials if t.number in stale)], key=lambda t: t.number)
    return Report(
        study=study.name,
        directions=tuple(study.directions),
        objectives=tuple(objectives_of(study)),
        front=tuple(
            front_row(t, study.searched, study.objectives, ties)
            for t, ties in zip(front, study.ties_on_stability(front, shown))
            if t.values is not None
        ),
        trials=tuple(trial_record(t, study.searched, numbers, study.objectives) for t in listed),
        status_counts=counts_with_stale(study),
        stale=tuple(stale.values()),
        nan_causes={cause: tuple(nan) for cause, nan in study.nan_causes.items()},
        largest_max_seq_length_by_batch=largest_fitting_seq(fit_map_data(study)),
        importance=importance_data(study),
        picks={name: choice.chosen().number for name, choice in chosen.items()},
        pick_lines=pick_lines(outcomes),
        memory_prediction=memory_prediction_data(study),
        other_setups=other_setups_line(study),
        cards=study.cards,
    )
