"""Which trial ``sweep export`` writes: trial N, or what a pick chooses (:mod:`sweeper.study.picks`, where the picks
are decided) among the trials the format can express; the nearest trial a format can express; and the one-line
refusals otherwise."""

from __future__ import annotations

import math

from sweeper.errors import StudyError
from sweeper.export._registry import EXPORT_FORMATS, export_format
from sweeper.notation import format_margin
from sweeper.study import StoredTrial, StudySnapshot
from sweeper.study.picks import Pick, PickOutcome, Within, choose, complete_trials, confirmation_refusal, objectives
from sweeper.trial import TrialStatus


def inexpressible(trial: StoredTrial, fmt: str) -> str | None:
    """Why ``fmt`` cannot train ``trial`` as it ran, or None when it can: the format's
    :attr:`~sweeper.export._format.ExportFormat.limit` (LLaMA-Factory has no float32 compute dtype on a GPU, axolotl no
    fractional ``lora_alpha``). The other formats express every trial.

    Raises:
        ValueError: No format is named ``fmt``.
    """
    return export_format(fmt).cannot_express(trial)


def _formats_expressing(trial: StoredTrial, fmt: str) -> str:
    """The formats other than ``fmt`` that express ``trial``, as ``hf, trl or axolotl`` (``json`` is never offered:
    :attr:`~sweeper.export._format.ExportFormat.offered_instead`)."""
    others = [f.name for f in EXPORT_FORMATS if f.name != fmt and f.offered_instead and f.cannot_express(trial) is None]
    return others[0] if len(others) == 1 else ", ".join(others[:-1]) + " or " + others[-1]


def _within(fmt: str) -> Within:
    """The trials ``fmt`` can express, as a pick narrows to them (:class:`sweeper.study.picks.Within`)."""
    return Within(fmt=fmt, cannot_express=export_format(fmt).cannot_express)


def _expressible_trials(study: StudySnapshot, fmt: str) -> list[StoredTrial]:
    """The measured COMPLETE trials of the study's current setup ``fmt`` can express
    (:func:`sweeper.study.picks.complete_trials`) whose confirmation did not fail."""
    return [t for t in complete_trials(study, _within(fmt)) if t.confirmation is None or t.confirmation.passed]


def nearest_expressible(study: StudySnapshot, trial: StoredTrial, fmt: str) -> StoredTrial | None:
    """The trial ``fmt`` can express nearest ``trial``: the fewest settings changed (the same configuration in
    another compute dtype first), then the nearest objectives (each scaled to [0, 1] over the candidates); None when
    ``fmt`` can express no complete trial."""
    candidates = _expressible_trials(study, fmt)
    if not candidates:
        return None
    values = [objectives(t) for t in candidates] + [objectives(trial)]
    n = len(values[-1])
    lows = [min(v[i] for v in values) for i in range(n)]
    spans = [(max(v[i] for v in values) - lows[i]) or 1.0 for i in range(n)]
    mine = trial.config.to_dict() if trial.config is not None else {}

    def key(t: StoredTrial) -> tuple[int, float, int]:
        theirs = t.config.to_dict() if t.config is not None else {}
        changed = sum(1 for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        a, b = objectives(trial), objectives(t)
        distance = math.hypot(*((a[i] - b[i]) / spans[i] for i in range(n)))
        return (changed, round(distance, 12), t.number)

    return min(candidates, key=key)


def choose_for_format(study: StudySnapshot, pick: Pick | str = Pick.SAFE, fmt: str | None = None) -> PickOutcome:
    """What ``pick`` chooses among the trials ``fmt`` can express (:func:`sweeper.study.picks.choose`, whose rules
    these are; all trials without ``fmt``).

    Raises:
        StudyError: ``fmt`` can express no complete trial of the study that did not fail its confirmation (the line
            names the formats that can, or the fix of the format's limit).
        ValueError: ``pick`` is not a pick.
    """
    front = study.front
    if fmt is not None and any(inexpressible(t, fmt) for t in front) and not _expressible_trials(study, fmt):
        limit = export_format(fmt).limit
        why, fix = (limit.every, limit.fix) if limit else ("", "")  # a limit made some trial inexpressible
        raise StudyError(
            f"{study.name}: --format {fmt}: no complete trial of the study can be expressed in it ({why}); export "
            f"with --format {_formats_expressing(front[0], fmt)}, or {fix}"
        )
    return choose(study, pick, _within(fmt) if fmt is not None else None)


def pick_trial(
    study: StudySnapshot, *, number: int | None = None, pick: Pick | str = Pick.SAFE, fmt: str | None = None
) -> StoredTrial:
    """The trial to export: trial ``number``, or the front's ``safe``, ``knee``, ``min-memory`` or ``most-stable``
    point (:func:`choose_for_format`).

    Raises:
        StudyError: No such trial, the trial did not complete or failed its confirmation (its status and reason are
            named), the format cannot express it, or the study has no complete trial (that the format can express)
            that did not fail its confirmation.
    """
    if number is not None:
        return _numbered_trial(study, number, fmt)
    return choose_for_format(study, pick, fmt).chosen()


def _numbered_trial(study: StudySnapshot, number: int, fmt: str | None) -> StoredTrial:
    """``--trial N``: the measured trial ``number`` stands for (a repeat's original), refused in one line when it did
    not complete, failed its confirmation or ``fmt`` cannot express it."""
    name = study.name
    trials = study.by_number
    if number not in trials:
        raise StudyError(
            f"{name}: --trial: no trial {number} in this study (trials 0-{len(trials) - 1}); "
            "see 'sweep report " + name + "'"
        )
    t = trials[number]
    if t.repeat_of is not None:  # a repeat reused an earlier trial's result: that one was measured
        t = trials[t.repeat_of]
    if t.status != TrialStatus.COMPLETE or t.values is None:
        reason = t.stored_reason if t.stored_reason is not None else "no result"
        raise StudyError(
            f"{name}: --trial: trial {number} did not complete ({t.status_name}: {reason}); export a "
            "complete trial, e.g. --pick knee"
        )
    if (refusal := confirmation_refusal(name, t)) is not None:
        raise StudyError(f"{name}: --trial: {refusal}")
    if fmt is not None and (why := inexpressible(t, fmt)) is not None:
        raise StudyError(f"{name}: --format {fmt}: trial {number}: {why}; " + _instead(study, t, fmt))
    return t


def _instead(study: StudySnapshot, trial: StoredTrial, fmt: str) -> str:
    """The fix for a trial ``fmt`` cannot express: the nearest trial it can, or the formats that express it."""
    near = nearest_expressible(study, trial, fmt)
    formats = _formats_expressing(trial, fmt)
    if near is None:
        return f"no complete trial of the study can be; export with --format {formats}"
    peak = objectives(near)[0]
    margin = format_margin(near.result.stress.stability_margin, near.result.stress.margin_capped)
    dtype = near.config.bnb_4bit_compute_dtype if near.config is not None else "?"
    return (
        f"the nearest trial it can express is {near.number} ({dtype}, peak {peak:.3f} GiB, margin "
        f"{margin}): --trial {near.number}; or export trial {trial.number} with --format "
        f"{formats}"
    )
