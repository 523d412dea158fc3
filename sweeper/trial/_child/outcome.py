"""How a trial ended, from what ended it (child side, imports no torch): one pure mapping, :func:`outcome_of`, from
the exception that stopped training (or None) and what the :class:`~sweeper.trial._child.record.TrainingRecord`
recorded to the result's ``status``, ``reason``, ``fail_phase`` and ``fail_step`` (and, after a NaN, the diagnosis's
``nan_cause``, ``nan_samples`` and ``nan_module``).

The ladder, first match wins:

- no exception: ``complete``, ``N steps finished``;
- :class:`~sweeper.trial._child.record.NonFiniteError`: ``nan`` at the step being run, in its phase, the diagnosis's
  reason appended when it ran;
- :class:`~sweeper.trial._child.record.DivergedError`: ``diverged`` at the divergence's step;
- :class:`~sweeper.trial._child.checks.SetupCheckError` (quantization, LoRA targets, packing): ``error`` while
  loading (step 0);
- anything else: ``oom`` when it is an allocation failure (:func:`~sweeper.trial._child.memory.oom_cause_chain`:
  under the CPU cap also oneDNN's "could not create a primitive", named in the reason; or, while loading, when
  transformers' load report mentioned one), naming the step's shape after loading; else
  ``error`` with the exception's type and the first line of its message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweeper.space import TrialConfig
from sweeper.trial._child.checks import PackingCheckError, SetupCheckError
from sweeper.trial._child.diagnosis import NanCause
from sweeper.trial._child.memory import ONEDNN_UNDER_CAP, CapExceeded, is_oom, oom_cause_chain
from sweeper.trial._child.record import DivergedError, NonFiniteError, TrainingRecord
from sweeper.trial._result import FailPhase
from sweeper.trial._status import TrialStatus


@dataclass(kw_only=True)
class Outcome:
    """How a trial ended; every field is the :class:`~sweeper.trial._result.TrialResult` field stored under the same
    name (``nan_cause`` is ``result.nan.cause``).

    Attributes:
        status: The trial's status.
        reason: One line, for people.
        fail_phase: The phase it failed in, None when it did not fail.
        fail_step: 1-based optimizer step it failed at (0 while loading), None when it did not fail.
        nan_cause, nan_samples, nan_module: The NaN diagnosis's findings (``nan`` only).
    """

    status: TrialStatus
    reason: str
    fail_phase: FailPhase | None = None
    fail_step: int | None = None
    nan_cause: NanCause | None = None
    nan_samples: list[int] = field(default_factory=list)
    nan_module: str | None = None


def _nan(exc: NonFiniteError, record: TrainingRecord) -> Outcome:
    step = record.step + 1
    out = Outcome(status=TrialStatus.NAN, reason=exc.describe(step), fail_phase=exc.fail_phase, fail_step=step)
    diagnosis = exc.diagnosis
    if diagnosis is not None:
        out.reason += f"; {diagnosis.reason}"
        out.nan_cause, out.nan_samples, out.nan_module = diagnosis.cause, diagnosis.samples, diagnosis.module
    return out


def _unexpected(
    exc: BaseException, record: TrainingRecord, config: TrialConfig, load_oom: bool, cpu_capped: bool
) -> Outcome:
    loading = record.fail_phase == "load"
    step = 0 if loading else record.step + 1
    where = "while loading" if loading else f"at step {step} ({record.fail_phase})"
    running = record.running  # the instrument whose work failed, if one owns its failure (the worst-case step)
    in_instrument = running is not None and running.owns_failure
    if in_instrument:
        where = running.failure_where() or where
    cause = oom_cause_chain(exc, cpu_capped)
    if cause is not None or (loading and load_oom):
        reason = f"out of memory {where} under memory_limit_gib={config.memory_limit_gib:g}"
        if isinstance(cause, CapExceeded):
            reason += f" ({cause}: on the CPU the cap binds the resident set at each step's end, as a card would)"
        if cause is not None and not is_oom(cause):  # accepted as oneDNN's failure under the cap
            reason += f" (oneDNN: {ONEDNN_UNDER_CAP}, an allocation it needed having failed under the cap)"
        shape = _failing_shape(record)
        if shape is not None:
            rows, tokens = shape
            what = "packed rows" if config.packing else "rows"
            reason += f" on a step of {rows} x {tokens} tokens"
            settings = (
                f"per_device_train_batch_size={config.per_device_train_batch_size}, "
                f"max_seq_length={config.max_seq_length}"
            )
            what = f"the data's {rows} longest {what}" if in_instrument else what
            reason += f" ({what}; {settings})"
        return Outcome(status=TrialStatus.OOM, reason=reason, fail_phase=record.fail_phase, fail_step=step)
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    reason = f"{type(exc).__name__} {where}" + (f": {first}" if first else "")
    return Outcome(status=TrialStatus.ERROR, reason=reason, fail_phase=record.fail_phase, fail_step=step)


def _failing_shape(record: TrainingRecord) -> tuple[int, int] | None:
    """``(rows, tokens)`` of the micro-batch that was running when the trial failed: the failing instrument's (the
    worst-case step's), or the current step's last micro-batch; None while loading or before any batch."""
    if record.fail_phase == "load":
        return None
    running = record.running if record.running is not None and record.running.owns_failure else None
    batch = running.failure_batch() if running is not None else None
    if batch is None and record.step_batches and running is None:
        batch = record.step_batches[-1]
    if batch is None:
        return None
    rows, tokens = batch["input_ids"].shape
    return int(rows), int(tokens)


def outcome_of(
    exc: BaseException | None,
    record: TrainingRecord,
    config: TrialConfig,
    *,
    load_oom: bool = False,
    cpu_capped: bool = False,
) -> Outcome:
    """How the trial ended (the ladder of the module docstring).

    Args:
        exc: What ended training, None when it ran to ``max_steps``.
        record: What training recorded: its ``phase`` and ``step`` (optimizer steps finished) place a failure.
        config: The trial (``memory_limit_gib``, ``per_device_train_batch_size`` and ``max_seq_length`` for an OOM's
            reason).
        load_oom: Whether transformers' load report mentioned an allocation failure
            (:meth:`sweeper.trial._child.load.LoadReport.mentions_oom`): while loading, it makes an error an OOM.
        cpu_capped: Whether the trial ran under the CPU cap (``RLIMIT_DATA``): oneDNN's failures are then OOMs.

    Returns:
        The outcome; pure (reads its arguments, changes nothing).
    """
    if exc is None:
        return Outcome(status=TrialStatus.COMPLETE, reason=f"{record.step} steps finished")
    if isinstance(exc, NonFiniteError):
        return _nan(exc, record)
    if isinstance(exc, DivergedError):
        return Outcome(status=TrialStatus.DIVERGED, reason=exc.divergence.reason, fail_step=exc.divergence.step)
    if isinstance(exc, SetupCheckError):
        if isinstance(exc, PackingCheckError):
            what = "packing check"
        else:
            what = "LoRA target check" if "target_modules" in str(exc) else "4-bit quantization check"
        return Outcome(status=TrialStatus.ERROR, reason=f"{what} failed: {exc}", fail_phase="load", fail_step=0)
    return _unexpected(exc, record, config, load_oom, cpu_capped)
