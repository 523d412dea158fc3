"""Confirmation runs: the front's chosen configurations run again at a long horizon, through the same trial process as
the sweep (caps, NaN/OOM/divergence, diagnosis, artifacts), so that what a short trial promised is checked before a
user trusts it. This is multi-fidelity for a two-objective study done after the fact: Optuna's pruners do not support
multi-objective studies (optuna#3450, #5268), so the low fidelity is the sweep and the high fidelity is this.

Where the outcome is kept: Optuna refuses to change a finished trial's attributes, so each confirmation is a study
user attribute ``confirmation:<trial number>`` (a :class:`Confirmation` as a dict); :func:`sweeper.study.stored_trials`
attaches it to its trial. The long run's files are in ``studies/<study>/trials/<number>/confirm-<steps>/``, its
trace an artifact of the study. A confirmation is written only when its run has ended, so a run killed midway leaves
nothing half-written: running the same command again runs it again, and skips the trials already confirmed at that
horizon or longer.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from sweeper.errors import SpaceError, StudyError
from sweeper.space import TrialConfig
from sweeper.stability import derive_margin_figures
from sweeper.storage import StudyAttr, trial_dir
from sweeper.study import (
    Confirmation,
    StoredTrial,
    StudyLike,
    StudySnapshot,
    artifact_store,
    by_knee_distance,
    loss_curve_svg,
    snapshot,
)
from sweeper.study.picks import safe_choice
from sweeper.trial import Measures, TrialProgress, TrialResult, TrialStatus, run_trial

#: A confirmation runs this many times the trial's own ``max_steps`` unless told otherwise.
DEFAULT_HORIZON_FACTOR = 10


def candidates(study: StudyLike) -> list[StoredTrial]:
    """The trials to confirm in order of preference: what ``sweep export`` writes by default first (the ``safe`` pick
    among every complete trial, :func:`sweeper.study.picks.safe_choice`), then the front's by distance to the
    knee (:func:`by_knee_distance`), those
    that barely learn (:meth:`~sweeper.study.StudySnapshot.learning`) after the rest."""
    snap = snapshot(study)
    front, objectives = snap.front, snap.objectives
    learns = by_knee_distance(snap.learning(front), objectives)  # the knee as sweep export --pick knee finds it
    complete = [
        t for t in snap.current(snap.trials) if t.status == TrialStatus.COMPLETE and t.values and not t.is_repeat
    ]
    if complete:  # the safe pick is chosen among every complete trial, as sweep export chooses it
        safe, _ = safe_choice(snap, snap.learning(complete))
        learns = [safe, *(t for t in learns if t.number != safe.number)]
    chosen = {t.number for t in learns}
    return learns + by_knee_distance([t for t in front if t.number not in chosen], objectives)


def trials_to_confirm(study: StudySnapshot, *, numbers: list[int] | None, front: bool, pick: str) -> list[int]:
    """What ``sweep confirm`` runs: the trial ``numbers`` given; with ``front``, every trial of the front in
    :func:`candidates`' order; else the one ``pick`` (``safe``, ``knee``, ...: :func:`sweeper.study.picks.choose`)
    chooses among every trial of the front, confirmed or not (``safe`` is :func:`candidates`' first).

    Raises:
        SpaceError: Neither numbers nor ``front``, and the study has no complete trial to confirm.
    """
    from sweeper.study.picks import choose

    if numbers is not None:  # a number that is not a complete trial is refused by confirm_trials
        return numbers
    ranked = candidates(study)
    if front:
        return [t.number for t in ranked]
    if not ranked:
        raise SpaceError(
            f"{study.name}: --pick: the study has no complete trial to confirm; run more trials with 'sweep run'"
        )
    return [ranked[0].number if pick == "safe" else choose(study, pick, prefer_confirmed=False).chosen().number]


def horizon(trial: StoredTrial, steps: int | None) -> int:
    """The confirmation's length: ``steps``, else :data:`DEFAULT_HORIZON_FACTOR` times the trial's ``max_steps``."""
    if steps is not None:
        return steps
    assert trial.config is not None
    return DEFAULT_HORIZON_FACTOR * trial.config.max_steps


def long_config(config: TrialConfig, steps: int) -> TrialConfig:
    """The trial's configuration at ``steps`` optimizer steps, its timeout scaled with its length."""
    scale = max(1.0, steps / max(1, config.max_steps))
    return replace(config, max_steps=steps, trial_timeout_s=config.trial_timeout_s * scale)


def _exported(config: TrialConfig) -> TrialConfig:
    """:meth:`~sweeper.space.TrialConfig.as_exported`, its timeout scaled with the micro-batches a step now runs."""
    exported = config.as_exported()
    scale = max(1.0, exported.gradient_accumulation_steps / config.gradient_accumulation_steps)
    return replace(exported, trial_timeout_s=config.trial_timeout_s * scale)


def _record(
    study: optuna.Study,
    number: int,
    steps: int,
    result: TrialResult,
    folder: Any,
    trial: StoredTrial | None = None,
    config: TrialConfig | None = None,
    as_exported: bool = False,
) -> Confirmation:
    """Write the long run's trace as an artifact of the study and its outcome as ``confirmation:<number>``, with
    whether it held where the short trial's margin said it would (``predicted_to_hold``, ``margin_held``), and the
    effective batch it ran (``config``'s) and whether that is the export's (``as_exported``)."""
    import json

    probe = result.constant.probe_loss_trace
    artifact_id = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        trace = {
            "loss": result.constant.loss_trace,
            "grad_norm": result.constant.grad_norm_trace,
            "probe_steps": result.constant.probe_steps,
            "probe_loss": probe,
        }
        (folder / "confirm_trace.json").write_text(json.dumps(trace))
        (folder / "confirm_loss_curve.svg").write_text(
            loss_curve_svg(
                result.constant.loss_trace,
                result.constant.grad_norm_trace,
                f"trial {number}, {steps}-step confirmation",
            )
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            artifact_id = optuna.artifacts.upload_artifact(
                artifact_store=artifact_store(study.study_name),
                file_path=str(folder / "confirm_trace.json"),
                study_or_trial=study,
                mimetype="application/json",
            )
    except OSError as exc:
        warnings.warn(f"trial {number}: the confirmation's artifacts were not stored ({exc})", stacklevel=2)
    outcome = Confirmation.of(
        result,
        steps=steps,
        artifact_id=artifact_id,
        effective_batch_size=config.effective_batch_size if config is not None else None,
        as_exported=as_exported,
        **_prediction(trial, result, steps),
    )
    if outcome.is_outcome:
        study.set_user_attr(f"{StudyAttr.CONFIRMATION}{number}", outcome.to_dict())
    else:  # the attempt failed, not the configuration: an earlier outcome stands, and the same command runs it again
        study.set_user_attr(f"{StudyAttr.CONFIRMATION_ATTEMPT}{number}", outcome.to_dict())
    return outcome


def _prediction(trial: StoredTrial | None, result: TrialResult, steps: int) -> dict[str, Any]:
    """What the short trial's margin said of this long run of ``steps`` steps, and whether the long run agreed; empty
    for a trial without a margin or a run that did not train (``oom``, ``timeout``, ``crash``, ``error``).

    It says "holds" when the chance of diverging within ``steps`` steps is called ``safe`` (its upper end under 5%),
    "fails" when it is called ``likely fails`` (over 50%), and nothing (``predicted_to_hold`` None) when it is
    ``undecided``, where either outcome is within the prediction
    (:class:`sweeper.stability._chance.DivergenceChance`). A study calibrated by ``sweep calibrate`` keeps its own
    rule: "holds" at most the low end of ``predicted_max_lr``'s 95% interval, "fails" above its high end."""
    stress = trial.result.stress if trial is not None else None
    predicted = stress.predicted_max_lr if stress is not None else None
    if predicted is None or stress is None or trial is None or trial.config is None:
        return {}
    if result.status not in (TrialStatus.COMPLETE, TrialStatus.NAN, TrialStatus.DIVERGED):
        return {"predicted_max_lr": predicted}
    rate = trial.config.learning_rate
    holds: bool | None
    if stress.predicted_max_lr_calibrated:
        low = stress.predicted_max_lr_low if stress.predicted_max_lr_low is not None else predicted
        high = stress.predicted_max_lr_high if stress.predicted_max_lr_high is not None else math.inf
        holds = True if rate <= low else False if rate > high else None
    else:
        at = replace(stress)  # the figures at the confirmation's own length, the stored ones untouched
        derive_margin_figures(at, rate, None, steps)
        holds = {"safe": True, "likely fails": False}.get(at.stability_call or "")
    return {
        "predicted_max_lr": predicted,
        "predicted_to_hold": holds,
        "margin_held": None if holds is None else holds == (result.status == TrialStatus.COMPLETE),
    }


class ConfirmCallback:
    """What :func:`confirm_trials` tells as it runs, as :class:`sweeper.sweep.SweepCallback` does for a sweep:
    subclass it and override what you need (each method does nothing here)."""

    def confirmation_started(self, trial: StoredTrial, steps: int) -> None:
        """``trial``'s long run of ``steps`` steps is starting."""

    def confirmation_progress(self, trial: StoredTrial, progress: TrialProgress) -> None:
        """``trial``'s long run sent a progress report (:meth:`sweeper.trial.TrialProcess.run`)."""

    def confirmation_finished(self, trial: StoredTrial, confirmation: Confirmation) -> None:
        """``trial``'s long run ended (stored on the study when it is an outcome: :attr:`Confirmation.is_outcome`)."""

    def confirmation_skipped(self, trial: StoredTrial, earlier: Confirmation) -> None:
        """``trial`` was confirmed before at this horizon or longer: ``earlier`` stands, nothing runs."""


def confirm_trials(
    study: optuna.Study,
    numbers: Sequence[int],
    *,
    steps: int | None,
    model_path: str,
    callback: ConfirmCallback | None = None,
    as_exported: bool = False,
) -> dict[int, Confirmation]:
    """Run each trial's configuration for ``steps`` steps (default :func:`horizon`) in a trial process and store the
    outcome on the study; a trial already confirmed at that horizon or longer (and, with ``as_exported``, as
    exported) is skipped.

    Args:
        study: A study that ``sweep run`` wrote.
        numbers: COMPLETE trials of the study (a repeat stands for the trial it repeats).
        steps: The horizon, or None for :func:`horizon`.
        model_path: The local checkpoint the trials load (:func:`sweeper.model.resolve_model`).
        callback: Told as each run starts, reports progress and ends, and of each trial skipped.
        as_exported: Run the configuration ``sweep export`` writes (:meth:`~sweeper.space.TrialConfig.as_exported`:
            the export's ``gradient_accumulation_steps``, so its effective batch), its timeout scaled with the
            accumulation; else the trial's own.

    Returns:
        The confirmations of ``numbers``, by trial number.

    Raises:
        StudyError: A number is not a trial of the study, did not complete, or has no stored config; or its horizon
            is not longer than its ``max_steps`` (nothing runs then).
        KeyboardInterrupt: After killing the running trial process; nothing is recorded for it.
    """
    snap = snapshot(study)
    chosen = _confirmable(snap, study.study_name, numbers, steps)
    done = snap.confirmations
    tell = callback or ConfirmCallback()
    out = {}
    for t in {t.number: t for t in chosen}.values():  # each once, in the order given
        assert t.config is not None
        n = horizon(t, steps)
        earlier = done.get(t.number)
        if earlier is not None and earlier.steps >= n and (earlier.as_exported or not as_exported):
            out[t.number] = earlier
            tell.confirmation_skipped(t, earlier)
            continue
        tell.confirmation_started(t, n)
        folder = trial_dir(study.study_name, t.number) / f"confirm-{n}{'-as-exported' if as_exported else ''}"
        config = long_config(_exported(t.config) if as_exported else t.config, n)
        result = run_trial(
            config,
            folder,
            model_path=model_path,
            measures=Measures(stress=None),
            on_progress=functools.partial(tell.confirmation_progress, t),
        )
        out[t.number] = _record(study, t.number, n, result, folder, t, config, as_exported)
        tell.confirmation_finished(t, out[t.number])
    return out


def _confirmable(snap: StudySnapshot, name: str, numbers: Sequence[int], steps: int | None) -> list[StoredTrial]:
    """Of :func:`confirm_trials`: the trials of ``numbers`` (a repeat as the trial it repeats), each checked before
    anything runs.

    Raises:
        StudyError: A number is not a trial of the study, did not complete, or its horizon is not longer than its
            ``max_steps``.
    """
    trials = snap.by_number
    chosen = []
    for number in numbers:
        t = trials.get(number)
        if t is None:
            raise StudyError(f"{name}: --trials: no trial {number} in this study; see 'sweep report {name}'")
        if t.repeat_of is not None:
            t = trials[t.repeat_of]
        if t.status != TrialStatus.COMPLETE or t.config is None:
            raise StudyError(
                f"{name}: --trials: trial {number} did not complete ({t.status_name}); "
                "confirm a complete trial, e.g. --pick knee or --front"
            )
        n = horizon(t, steps)
        if n <= t.config.max_steps:
            raise StudyError(
                f"{name}: --steps: a {n}-step confirmation is not longer than trial {t.number}'s "
                f"{t.config.max_steps} steps, so it would confirm nothing; give --steps above {t.config.max_steps}, "
                f"e.g. --steps {DEFAULT_HORIZON_FACTOR * t.config.max_steps}"
            )
        chosen.append(t)
    return chosen


def long_run_model_path(study: StudySnapshot, trial: StoredTrial) -> str:
    """The local checkpoint a long run (``sweep confirm``, ``sweep calibrate``) of ``trial`` loads, after checking
    what would fail every run before its first step: the one the sweep's trials loaded when it is still there, else
    the trial's model resolved again (the built-in model is converted once and cached); and the trial's data must
    still be readable (a file moved away, or a relative path read from another folder). The study's folder is checked
    writable with its owner (:func:`sweeper.storage.check_study_owner`).

    Raises:
        DataError: The data cannot be read (one line naming the file and the fix).
        ModelError: The model cannot be resolved.
    """
    from sweeper.data import load_samples
    from sweeper.model import resolve_model

    assert trial.config is not None  # a measured trial
    load_samples(trial.config.dataset)
    local = study.model_path
    if local and Path(local).exists():
        return str(local)
    return resolve_model(trial.config.model)
