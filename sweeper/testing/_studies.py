"""Studies for tests of the readers (report, export, dashboard): trials made the way the sweep records them
(:func:`sweeper.study.record_result`, the state and constraint of their :class:`sweeper.trial.TrialStatus`), in a
real Optuna storage, without training."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState, create_trial

from sweeper.space import DatasetSpec, ModelSpec, TrialConfig, parse_space
from sweeper.stability import derive_margin_figures, margin_interval
from sweeper.storage import StudyAttr

# The test helpers build studies as the sweep records them, from the study package's own modules (optuna.testing's
# shape): pyproject's private-modules contract lets sweeper.testing, and only it, import them.
from sweeper.study._objectives import stability_objective, study_objectives
from sweeper.study._storage import open_study, record_result
from sweeper.trial import TrialResult, TrialStatus

#: The searched keys of the studies made here.
STUDY_DISTRIBUTIONS: dict[str, BaseDistribution] = {
    "r": CategoricalDistribution([4, 8, 16]),
    "per_device_train_batch_size": CategoricalDistribution([1, 2, 4]),
    "max_seq_length": CategoricalDistribution([64, 128]),
}


class _Attrs:
    """Collects what :func:`sweeper.study.record_result` sets, for a trial made with ``create_trial``."""

    def __init__(self) -> None:
        self.user_attrs: dict[str, Any] = {}
        self.system_attrs: dict[str, Any] = {}

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value

    def set_constraint(self, key: str, value: float) -> None:
        self.system_attrs[f"constraints:{key}"] = float(value)  # where optuna.Trial.set_constraint keeps it


def _config(r: int, batch: int, seq: int, model: str) -> TrialConfig:
    return TrialConfig(
        r=r,
        per_device_train_batch_size=batch,
        max_seq_length=seq,
        max_steps=4,
        optim="adamw_torch",
        target_modules=("q_proj", "v_proj"),
        memory_limit_gib=4.0,
        trial_timeout_s=60.0,
        model=ModelSpec(name_or_path=model),
        dataset=DatasetSpec(),
    )


def add_trial(
    study: optuna.Study,
    *,
    r: int,
    batch: int,
    seq: int,
    status: str,
    peak: float | None = None,
    instability: float | None = None,
    extra: Mapping[str, Any] | None = None,
    model: str = "m",
) -> None:
    """Add a finished trial as the sweep records it: its config (r, ``batch`` rows of ``seq`` tokens on ``model``),
    its result (``status``, ``peak`` GiB, ``instability``, a 3-step trace) and its state and constraint.

    ``peak`` and ``instability`` are a complete trial's objective values. In a study that ranks by the stability
    margin (:func:`sweeper.study._objectives.stability_objective`), the second value is its ``edge_proximity``: the
    stored ``stability_margin`` is ``1 / instability`` (and ``learning_progress`` 0.2) unless ``extra`` gives them.

    ``extra``: a ``config`` (a stored config dict) replaces the trial's; ``params`` and ``distributions`` replace the
    sampled values (r, batch, seq) and their distributions; other keys that are :class:`TrialResult` stored names set
    the result's; the rest (``duplicate_of``, ``retry_of``, ...) are stored as user attributes as given.

    Raises:
        ValueError: ``status`` is not a :class:`TrialStatus` value, or a complete trial lacks an objective.
    """
    extra = dict(extra or {})
    config = TrialConfig.from_dict(extra.pop("config")) if "config" in extra else _config(r, batch, seq, model)
    params = extra.pop("params", {"r": r, "per_device_train_batch_size": batch, "max_seq_length": seq})
    distributions = extra.pop("distributions", STUDY_DISTRIBUTIONS)
    names = set(TrialResult.stored_names())
    fields: dict[str, Any] = {
        "status": TrialStatus(status),
        "reason": f"{status} reason",
        "lora_alpha": config.lora_alpha,
        "peak_memory_gib": peak,
        "memory_kind": "cpu_peak_rss",
        "instability": instability,
        "loss_trace": [2.0, 1.5, 1.2],
        "grad_norm_trace": [1.0, 0.8, 0.7],
        "versions": {"torch": "x"},
        "device": "cpu",
    }
    if status == "complete" and instability and stability_objective(study) == "edge_proximity":
        fields.update(stability_margin=1 / instability, margin_capped=False, learning_progress=0.2)
    result = TrialResult.from_dict({**fields, **{k: v for k, v in extra.items() if k in names}})
    _derive_stress_figures(result, config)
    attrs = _Attrs()
    record_result(attrs, result, config)
    attrs.user_attrs.update({k: v for k, v in extra.items() if k not in names})
    state = TrialState[result.status.optuna_state]
    values = None
    if state == TrialState.COMPLETE:
        if peak is None or instability is None:
            raise ValueError("a complete trial has both objectives: give peak and instability")
        # peak and instability are the memory and stability objectives' values as given; any other objective of
        # the study (a registered third one) is computed from the result, as the sweep computes it
        given = {"memory": peak, "stability": instability}
        values = [given[o.role] if o.role in given else o.value_of(result) for o in study_objectives(study)]
    study.add_trial(
        create_trial(
            state=state,
            values=values,
            params=params,
            distributions=distributions,
            user_attrs=attrs.user_attrs,
            system_attrs=attrs.system_attrs,
        )
    )


def _derive_stress_figures(result: TrialResult, config: TrialConfig) -> None:
    """Fill in what a trial derives from its stability margin when the test did not give it, as the trial stores
    it (at the default horizon, 400 steps): the margin's interval, the learning-rate ceiling, the chance of diverging
    and ``predicted_max_lr`` with its interval (:func:`sweeper.stability.derive_margin_figures`)."""
    stress = result.stress
    if stress.stability_margin is not None and stress.predicted_max_lr is None:
        capped = bool(stress.margin_capped)
        stress.lr_ceiling = None if capped else stress.lr_ceiling or stress.stability_margin * config.learning_rate
        derive_margin_figures(stress, config.learning_rate)
    elif stress.stability_margin is not None and stress.stability_margin_low is None:
        stress.stability_margin_low, stress.stability_margin_high = margin_interval(
            stress.stability_margin, stress.margin_capped
        )


def add_configured_trials(
    study: optuna.Study, model: str | Path, trials: Iterable[tuple[Mapping[str, Any], float, float]]
) -> dict[str, Any]:
    """Complete trials of :func:`add_trial`'s configuration (r 8, batch 2 x 64) on ``model`` with other settings:
    ``trials`` is ``[(overrides, peak_gib, instability)]``; each trial's ``lora_alpha`` follows its config.

    Returns:
        The base configuration, as stored (a dict).
    """
    base = _config(8, 2, 64, str(model)).to_dict()
    for overrides, peak, instability in trials:
        config = {**base, **overrides}
        add_trial(
            study, r=8, batch=2, seq=64, status="complete", peak=peak, instability=instability, extra={"config": config}
        )
    return base


#: Per model, a database :func:`make_study` made before (without its identity), copied by the next call: building
#: the six trials takes most of a second, copying the file a few milliseconds.
_MADE: dict[str, Path] = {}


def _made_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="sweeper-make-study-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def make_study(folder: Path, model: str = "m") -> optuna.Study:
    """A study ``rep`` in ``folder/rep.db`` of six trials: two on the front (0, 1), one behind it (2), an ``oom``
    (3), a ``nan`` caused by the data (4, sample 7) and a repeat of trial 0 (5).

    Opened with :func:`sweeper.study.open_study`, which writes ``studies/rep/study.json`` in the working directory and
    gives each study its own identity (:attr:`sweeper.storage.StudyAttr.STUDY_ID`). The trials are built once per
    ``model`` in a process; later calls copy that database (without its identity) and open the copy.
    """
    space = parse_space({"study": {"name": "rep"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    url = f"sqlite:///{folder}/rep.db"
    made = _MADE.get(model)
    if made is not None and made.is_file():
        shutil.copyfile(made, folder / "rep.db")
        return open_study(space, url, "rep", 8)
    study = open_study(space, url, "rep", 8)
    study.set_user_attr(StudyAttr.SEARCHED, ["r", "per_device_train_batch_size", "max_seq_length"])
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=0.9, model=model)
    add_trial(study, r=8, batch=2, seq=64, status="complete", peak=1.5, instability=0.2, model=model)
    add_trial(study, r=16, batch=2, seq=128, status="complete", peak=2.0, instability=0.5, model=model)
    add_trial(study, r=16, batch=4, seq=128, status="oom", peak=3.9, model=model)
    nan = {"nan_cause": "data", "nan_samples": [7], "loss_trace": [2.0, None], "grad_norm_trace": [1.0, None]}
    add_trial(study, r=8, batch=1, seq=128, status="nan", peak=1.2, model=model, extra={**nan, "fail_step": 2})
    repeat = {"duplicate_of": 0}
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=0.9, model=model, extra=repeat)
    made = _made_dir() / "rep.db"
    shutil.copyfile(folder / "rep.db", made)
    with contextlib.closing(sqlite3.connect(made)) as conn, conn:  # a copy opened later is a study of its own
        conn.execute("DELETE FROM study_user_attributes WHERE key = ?", (StudyAttr.STUDY_ID,))
    _MADE[model] = made
    return study
