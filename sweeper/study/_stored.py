"""The typed view of a stored trial: one function, :func:`stored_trial`, turns an Optuna ``FrozenTrial`` into a
:class:`StoredTrial` (its configuration, its result, its status as an enum, what it repeats or retries), and every
reader of a study (report, export, dashboard, console, preflight, resume) reads trials through it.

The stored user attribute names are the contract (``docs/contract.md``) and do not change; a study written by an
older version is read through the same function: a key its stored ``config`` lacks takes the schema's default
(:meth:`sweeper.space.TrialConfig.from_dict`), an attribute its result lacks takes :class:`TrialResult`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.space import TrialConfig
from sweeper.stability import (
    STORED_COMPONENTS,
    Headroom,
    LrCalibration,
    StabilityFigures,
    derive_margin_figures,
    headroom_of,
)
from sweeper.storage import TrialAttr
from sweeper.study._confirmation import Confirmation
from sweeper.trial import TrialResult, TrialStatus


@dataclass(frozen=True, kw_only=True)
class StoredTrial:
    """One trial of a study as sweeper stored it.

    Attributes:
        number: The trial's number in the study.
        state: Optuna's state (COMPLETE, PRUNED, FAIL, RUNNING, WAITING).
        status: How it ended (:class:`TrialStatus`).
        params: The sampled values of the searched keys.
        values: The study's objective values (:func:`sweeper.study._objectives.study_objectives`, by default
            ``(peak_memory_gib, edge_proximity)``) of a COMPLETE trial, else None.
        config: The trial's full settings, or None when the trial stored none (never started, or not made by sweeper).
        result: What it measured (every :class:`TrialResult` field read from its user attributes).
        repeat_of: For a repeat of a configuration already measured (``duplicate_of``), the measured trial's number;
            its result was reused and nothing ran.
        retry_of: For a retry of a crashed, timed-out or interrupted trial, the first attempt's number.
        retry_attempt: 0 for a first attempt, 1.. for retries.
        retried: This attempt failed and its configuration was queued again (it does not count toward ``n_trials``).
        interrupted: Not run to its end (Ctrl-C, its sweep died or went silent); not counted, queued again.
        user_attrs: Every stored user attribute, for bookkeeping keys not typed here (``sweep_pid``, ...).
        frozen: The Optuna trial itself, for Optuna APIs (artifacts, notes).
        confirmation: Its long run (``sweep confirm``), attached by :func:`stored_trials` and :func:`pareto_front`;
            None when never confirmed.
    """

    number: int
    state: TrialState
    status: TrialStatus
    params: Mapping[str, Any]
    values: tuple[float, ...] | None
    config: TrialConfig | None
    result: TrialResult
    repeat_of: int | None = None
    retry_of: int | None = None
    retry_attempt: int = 0
    retried: bool = False
    interrupted: bool = False
    user_attrs: Mapping[str, Any] = field(default_factory=dict)
    frozen: FrozenTrial | None = None
    confirmation: Confirmation | None = None

    @property
    def is_repeat(self) -> bool:
        """A repeat of a configuration already measured: its result was reused and nothing ran."""
        return self.repeat_of is not None

    @property
    def counts(self) -> bool:
        """Counts toward ``n_trials``: ended, not interrupted, not a failed attempt that was retried, not a repeat."""
        return self.state.is_finished() and not (self.interrupted or self.retried or self.is_repeat)

    @property
    def measured(self) -> bool:
        """Ended with a result of its own: finished, not a repeat, with a known status."""
        return (
            self.state.is_finished()
            and not self.is_repeat
            and self.status not in (TrialStatus.UNKNOWN, TrialStatus.RUNNING, TrialStatus.WAITING)
        )

    @property
    def lora_alpha(self) -> float | None:
        """``lora_alpha`` as the trial ran it: the stored attribute, else ``lora_alpha_ratio * r`` of its config."""
        if self.result.provenance.lora_alpha is not None:
            return self.result.provenance.lora_alpha
        return self.config.lora_alpha if self.config is not None else None

    @property
    def headroom(self) -> Headroom | None:
        """``predicted_max_lr / learning_rate`` with its interval and whether it is near its edge
        (:func:`sweeper.stability.headroom_of`); None without a measured margin or a stored config."""
        return headroom_of(self.config.learning_rate if self.config is not None else None, self.result.stress)

    @property
    def stability(self) -> StabilityFigures:
        """Its stress phase's figures and :attr:`headroom` as every view shows them
        (:class:`sweeper.stability.StabilityFigures`); headroom None unless it completed."""
        complete = self.state == TrialState.COMPLETE
        failed = self.status in (TrialStatus.NAN, TrialStatus.DIVERGED)
        return StabilityFigures.of(self.result.stress, self.headroom if complete else None, failed=failed)

    @property
    def safely_below_edge(self) -> bool:
        """Its :attr:`headroom` is measured and not :attr:`~sweeper.stability.Headroom.near_edge`: what the ``safe``
        pick chooses among."""
        h = self.headroom
        return h is not None and not h.near_edge

    @property
    def legacy_instability(self) -> bool:
        """Its instability is sweeper 0.1.0's (``loss_spike + grad_norm_growth + skipped_step_fraction +
        activation_pressure`` of the training loss), not the probe's: the two are not comparable."""
        return (
            self.result.constant.instability is not None
            and "probe_rebound" not in self.user_attrs
            and ("activation_pressure" in self.user_attrs)
        )

    @property
    def stored_status(self) -> str | None:
        """The status as stored (``complete``, ``nan``, ...), None for a trial that stored none (running, queued,
        not made by sweeper)."""
        value = self.user_attrs.get(TrialAttr.STATUS)
        return None if value is None else str(value)

    @property
    def stored_reason(self) -> str | None:
        """The one-line reason as stored, None for a trial that stored no result."""
        value = self.user_attrs.get(TrialAttr.REASON)
        return None if value is None else str(value)

    @property
    def status_name(self) -> str:
        """The status as stored (``complete``, ``nan``, ...), or Optuna's state in lower case for a trial without
        one (``running``, ``waiting``, ``fail``)."""
        return str(self.user_attrs.get(TrialAttr.STATUS) or self.state.name.lower())

    @property
    def count_label(self) -> str:
        """The category :func:`status_counts` counts it under: ``repeated``, ``interrupted``, ``running``,
        ``waiting``, else its status."""
        if self.is_repeat:
            return "repeated"
        if self.interrupted:
            return "interrupted"
        return self.status_name


def _status(trial: FrozenTrial) -> TrialStatus:
    if trial.state == TrialState.RUNNING:
        return TrialStatus.RUNNING
    if trial.state == TrialState.WAITING:
        return TrialStatus.WAITING
    raw = trial.user_attrs.get(TrialAttr.STATUS)
    if raw is None:  # ended without a result sweeper wrote (an Optuna-level failure)
        return TrialStatus.UNKNOWN
    try:
        return TrialStatus(raw)
    except ValueError:
        return TrialStatus.UNKNOWN


def _config(attrs: Mapping[str, Any]) -> TrialConfig | None:
    raw = attrs.get(TrialAttr.CONFIG)
    if not isinstance(raw, Mapping):
        return None
    try:
        return TrialConfig.from_dict(raw)
    except (TypeError, ValueError):
        return None


def _result(
    attrs: Mapping[str, Any],
    config: TrialConfig | None,
    lr_calibration: LrCalibration | None,
    horizon_steps: int | None,
) -> TrialResult:
    """The stored result: the instability terms are stored flattened (see :func:`record_result`); the intervals of
    its figures filled in where a study written before them lacks them (:func:`with_intervals`)."""
    components = {name: attrs[name] for name in STORED_COMPONENTS if attrs.get(name) is not None}
    result = TrialResult.from_dict(
        {**attrs, "status": attrs.get(TrialAttr.STATUS, "error"), "instability_components": components}
    )
    with_intervals(result, config, lr_calibration, horizon_steps)
    return result


def with_intervals(
    result: TrialResult,
    config: TrialConfig | None,
    lr_calibration: LrCalibration | None,
    horizon_steps: int | None = None,
) -> None:
    """Derive ``result``'s stability figures from its stored margin as the study reads them
    (:func:`sweeper.stability.derive_margin_figures`): at ``horizon_steps`` (the study's ``confirm_steps``), with the
    study's own factor where ``sweep calibrate`` stored one (``lr_calibration``). A trial stored by an older version
    gets them too."""
    derive_margin_figures(
        result.stress, config.learning_rate if config is not None else None, lr_calibration, horizon_steps
    )


def stored_trial(
    trial: FrozenTrial,
    confirmation: Confirmation | None = None,
    lr_calibration: LrCalibration | None = None,
    horizon_steps: int | None = None,
) -> StoredTrial:
    """The typed view of one stored trial (see :class:`StoredTrial`), its stability figures at ``horizon_steps`` (the
    study's ``confirm_steps``; None: 400) and its ``predicted_max_lr`` from ``lr_calibration`` when the study has
    one (``sweep calibrate``): :func:`with_intervals`; never raises on a trial it cannot read in full:
    what is missing is None or its default. A ``confirmation`` no longer than the trial (earlier versions accepted
    ``--steps 1``) is not attached: it confirms nothing, and a pick would prefer it."""
    attrs = trial.user_attrs
    repeat = attrs.get(TrialAttr.DUPLICATE_OF)
    retry = attrs.get(TrialAttr.RETRY_OF)
    values = tuple(trial.values) if trial.state == TrialState.COMPLETE and trial.values else None
    return StoredTrial(
        number=trial.number,
        state=trial.state,
        status=_status(trial),
        params=dict(trial.params),
        values=values,
        config=(config := _config(attrs)),
        result=_result(attrs, config, lr_calibration, horizon_steps),
        repeat_of=int(repeat) if repeat is not None else None,
        retry_of=int(retry) if retry is not None else None,
        retry_attempt=int(attrs.get(TrialAttr.RETRY_ATTEMPT, 0)),
        retried=bool(attrs.get(TrialAttr.RETRIED, False)),
        interrupted=bool(attrs.get(TrialAttr.INTERRUPTED, False)),
        user_attrs=attrs,
        frozen=trial,
        confirmation=None
        if confirmation is not None and config is not None and confirmation.steps <= config.max_steps
        else confirmation,
    )


def is_finished(trial: FrozenTrial | StoredTrial) -> bool:
    """Counts toward ``n_trials`` (:attr:`StoredTrial.counts`)."""
    return (trial if isinstance(trial, StoredTrial) else stored_trial(trial)).counts


@dataclass(frozen=True, kw_only=True)
class PredictionError:
    """The preflight's prediction of one complete trial's peak memory against what it measured.

    Attributes:
        number: The trial's number.
        memory_kind: What its peak measures (``cpu_peak_rss``, ``cuda_max_reserved``), None when not recorded.
        predicted_gib: The memory model's prediction (GiB), None when unknown.
        corrected_gib: The prediction after the study's correction as it stood when the trial was asked (GiB), None
            when no correction existed yet.
        measured_gib: The measured peak (GiB, > 0).
        error: ``(predicted_gib - measured_gib) / measured_gib`` (negative: under), None without a prediction.
        corrected_error: The same for ``corrected_gib``, None without a correction.
    """

    number: int
    memory_kind: str | None
    predicted_gib: float | None
    corrected_gib: float | None
    measured_gib: float
    error: float | None
    corrected_error: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, keys in field order (``sweep report --json``'s ``memory_prediction.trials`` rows)."""
        return asdict(self)


def prediction_errors_of(trials: Sequence[StoredTrial]) -> list[PredictionError]:
    """Predicted vs measured for each measured ``complete`` trial (repeats left out), as the sweep predicted it before
    running it (:class:`PredictionError`, GiB); an error is ``(prediction - measured) / measured`` (negative: under),
    None where the prediction is unknown (for ``corrected_error``: no correction existed yet when the trial was
    asked)."""
    rows = []
    for t in trials:
        if t.is_repeat or t.status != TrialStatus.COMPLETE:
            continue
        measured = t.result.memory.peak_memory_gib
        if measured is None or measured <= 0:
            continue
        predicted = t.result.memory.predicted_peak_gib
        corrected = t.user_attrs.get(TrialAttr.CORRECTED_PEAK_GIB)
        corrected = float(corrected) if isinstance(corrected, (int, float)) else None
        rows.append(
            PredictionError(
                number=t.number,
                memory_kind=t.result.memory.memory_kind,
                predicted_gib=predicted,
                corrected_gib=corrected,
                measured_gib=measured,
                error=None if predicted is None else (predicted - measured) / measured,
                corrected_error=None if corrected is None else (corrected - measured) / measured,
            )
        )
    return rows
