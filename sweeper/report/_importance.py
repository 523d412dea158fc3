"""What moved each objective: the memory model's effect of each searched setting on the peak, and optuna's
importance of the settings for stability, with a bootstrap interval.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import warnings
from collections.abc import Container
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.report._analysis_records import MemoryEffects, NotShown, ParamImportance
from sweeper.report._records import ImportancePart
from sweeper.study import StoredTrial, StudySnapshot

#: Complete trials (of the current setup) below which no importance is shown for the stability objective: on fewer,
#: optuna's evaluator ranks noise (on an 8-trial study it ranked lora_alpha/r second for peak memory, which no
#: tensor's size depends on).
MIN_IMPORTANCE_TRIALS = 20


#: Bootstrap resamples of the trials behind each importance's interval.
IMPORTANCE_RESAMPLES = 20


def _objective(i: int) -> Any:
    """The target function of objective ``i`` for ``optuna.importance``."""
    return lambda t: t.values[i]


def memory_effects(study: StudySnapshot, trials: list[StoredTrial]) -> MemoryEffects | NotShown:
    """Which searched setting moves the predicted peak, and by how much, at the study's own configurations: for each
    searched key, the spread (max - min, GiB) of the memory model's prediction over the key's searched values with
    every other setting as a trial had it, the median over the study's measured configurations. A key the memory
    model does not depend on (``lora_alpha_ratio``, ``learning_rate``, the quant type) moves it by exactly 0.

    Returns:
        The spread by setting, or why it is not shown (the model's shape is unknown, or no trial stored its
        configuration).
    """
    from sweeper.memory import memory_predictor

    configured = [t for t in trials if t.config is not None]
    if not configured:
        return NotShown(reason="no measured trial stored its configuration")
    first = configured[0].config
    assert first is not None
    device = "cuda" if str(configured[0].result.provenance.device or "").startswith("cuda") else "cpu"
    path = str(study.model_path or first.model.name_or_path)
    predict = memory_predictor(path, first.model.name_or_path, first.model.attn_implementation, device)
    values = _searched_values(study)
    effects: dict[str, list[float]] = {key: [] for key in values}
    spreads: dict[str, dict[str, float]] = {}  # by configuration: a study of thousands of trials repeats them
    for t in configured:
        assert t.config is not None
        seen = spreads.setdefault(repr(t.config), {})
        for key, choices in values.items():
            if key not in seen:
                peaks = [predict(dataclasses.replace(t.config, **{key: v})) for v in choices]
                known = [p for p in peaks if p is not None]
                if len(known) < len(peaks):
                    return NotShown(
                        reason="the memory model does not know this model's shape (no readable config.json)"
                    )
                seen[key] = max(known) - min(known)
            effects[key].append(seen[key])
    return MemoryEffects(
        effects_gib={k: float(statistics.median(v)) for k, v in effects.items() if v},
        configurations=len(configured),
    )


def _searched_values(study: StudySnapshot) -> dict[str, list[Any]]:
    """Each searched key's values as the study's trials were sampled from them: a categorical's choices, a range's
    ends."""
    out: dict[str, list[Any]] = {}
    for t in study.trials:
        for key, dist in (t.frozen.distributions if t.frozen is not None else {}).items():
            if key in out:
                continue
            choices = getattr(dist, "choices", None)
            out[key] = list(choices) if choices is not None else [dist.low, dist.high]  # type: ignore[attr-defined]
    return out


def importance_data(study: StudySnapshot) -> dict[str, ImportancePart]:
    """What explains each objective over the study's current setup (:meth:`sweeper.study.StudySnapshot.current`).

    - ``peak_memory_gib``: the memory model itself (:func:`memory_effects`), not a fit to a handful of measured
      points.
    - the stability objective: optuna's default importance (``optuna.importance.get_param_importances``, PED-ANOVA
      in optuna 5) over the
      COMPLETE trials, only from :data:`MIN_IMPORTANCE_TRIALS` of them, with a 90% interval from
      :data:`IMPORTANCE_RESAMPLES` bootstrap resamples of the trials (each resample's importances sum to 1).

    Returns:
        ``{"peak_memory_gib": memory_effects(...), <stability objective>: ParamImportance | NotShown, ...}``, in
        the study's objective order.
    """
    current = study.current(study.measured)
    names = [o.name for o in study.objectives]
    out: dict[str, ImportancePart] = {names[0]: memory_effects(study, current)}
    complete = [t for t in current if t.state == TrialState.COMPLETE and t.frozen is not None]
    for i, name in enumerate(names[1:], start=1):
        if len(complete) < MIN_IMPORTANCE_TRIALS:
            out[name] = NotShown(
                reason=f"{len(complete)} complete trial{'s' if len(complete) != 1 else ''}; a ranking needs "
                f"{MIN_IMPORTANCE_TRIALS} (on fewer it ranks noise)"
            )
            continue
        out[name] = _bootstrap_importance(
            [t.frozen for t in complete if t.frozen is not None], [o.optuna_direction for o in study.objectives], i
        )
    return out


class _ResampleStorage(optuna.storages.InMemoryStorage):
    """An in-memory storage whose one study's trials are :attr:`trials`, as given (a bootstrap resample repeats
    trials; they are read, never written). Only :meth:`get_all_trials` (optuna's ``BaseStorage`` API, what the
    importance evaluators read) differs from :class:`optuna.storages.InMemoryStorage`."""

    def __init__(self) -> None:
        super().__init__()
        self.trials: list[FrozenTrial] = []

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        picked = [t for t in self.trials if states is None or t.state in states]
        return copy.deepcopy(picked) if deepcopy else picked


def _bootstrap_importance(trials: list[Any], directions: Any, index: int) -> ParamImportance | NotShown:
    """optuna's importance of objective ``index`` over bootstrap resamples of ``trials``."""
    import random

    rng = random.Random(0)
    samples: dict[str, list[float]] = {}
    # each resample is a study whose storage hands back the resampled trials as they are: copying them into a study
    # (optuna deep-copies each added trial) was most of a large study's report time
    storage = _ResampleStorage()
    resample = optuna.create_study(storage=storage, directions=directions)
    for _ in range(IMPORTANCE_RESAMPLES):
        storage.trials = [rng.choice(trials) for _ in trials]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = optuna.importance.get_param_importances(resample, target=_objective(index))
        except (RuntimeError, ValueError):  # a resample where no parameter varies
            continue
        for key, value in values.items():
            samples.setdefault(key, []).append(float(value))
    if not samples:
        return NotShown(reason="no parameter varies among the complete trials")

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]

    # most important first, ties by name: optuna's evaluator returns exactly tied parameters in an order that varies
    # with the process's hash seed, so two reports of one study could list them differently
    names = sorted(samples, key=lambda k: (-statistics.median(samples[k]), k))
    return ParamImportance(
        importance={k: float(statistics.median(samples[k])) for k in names},
        interval={k: (pct(samples[k], 0.05), pct(samples[k], 0.95)) for k in names},
        trials=len(trials),
    )
