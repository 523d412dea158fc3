"""Which trial ``sweep export`` writes: trial N, or the front's knee, min-memory or most-stable point, among the
trials the format can express and that did not fail their confirmation; and the one-line refusals otherwise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from sweeper.errors import StudyError
from sweeper.export._registry import EXPORT_FORMATS, export_format
from sweeper.stability import format_margin
from sweeper.study import (
    Objective,
    StoredTrial,
    StudyLike,
    StudySnapshot,
    by_knee_distance,
    snapshot,
)
from sweeper.trial import TrialStatus

Pick = Literal["knee", "min-memory", "most-stable"]
PICKS: tuple[str, ...] = ("knee", "min-memory", "most-stable")


def objectives(trial: StoredTrial) -> tuple[float, ...]:
    """The objective values of a COMPLETE trial (the front and the exported trials are), in the study's order
    (:func:`sweeper.study.study_objectives`): ``(peak_memory_gib, edge_proximity)`` by default,
    ``(peak_memory_gib, instability)`` in a study written before the stability margin."""
    if trial.values is None:
        raise StudyError(f"trial {trial.number} did not complete: it has no objective values")
    return trial.values


def knee(front: Sequence[StoredTrial], objectives: Sequence[Objective]) -> StoredTrial:
    """The front's point of best trade-off on ``objectives``: after scaling each objective to [0, 1] over the front
    (min-max, by its direction), the point nearest the ideal point in Euclidean distance, the "compromise solution"
    of multi-objective decision making (Zeleny 1973; Deb, *Multi-Objective Optimization using Evolutionary
    Algorithms*, 2001, 8.2). Ties go to the better stability objective, then the lower memory.

    Raises:
        ValueError: ``front`` is empty.
    """
    if not front:
        raise ValueError("the front is empty")
    return by_knee_distance(front, objectives)[0]


def inexpressible(trial: StoredTrial, fmt: str) -> str | None:
    """Why ``fmt`` cannot train ``trial`` as it ran, or None when it can: the format's
    :attr:`~sweeper.export.ExportFormat.limit` (LLaMA-Factory has no float32 compute dtype on a GPU, axolotl no
    fractional ``lora_alpha``). The other formats express every trial.

    Raises:
        ValueError: No format is named ``fmt``.
    """
    return export_format(fmt).cannot_express(trial)


def _formats_expressing(trial: StoredTrial, fmt: str) -> str:
    """The formats other than ``fmt`` that express ``trial``, as ``hf, trl or axolotl`` (``json`` is never offered:
    :attr:`~sweeper.export.ExportFormat.offered_instead`)."""
    others = [f.name for f in EXPORT_FORMATS if f.name != fmt and f.offered_instead and f.cannot_express(trial) is None]
    return others[0] if len(others) == 1 else ", ".join(others[:-1]) + " or " + others[-1]


def _expressible_trials(study: StudySnapshot, fmt: str) -> list[StoredTrial]:
    """The measured COMPLETE trials of the study's current setup (:func:`sweeper.study.current_trials`) ``fmt`` can
    express whose confirmation did not fail."""
    return [
        t
        for t in study.current(study.trials)
        if t.status == TrialStatus.COMPLETE
        and t.values is not None
        and not t.is_repeat
        and (t.confirmation is None or t.confirmation.passed)
        and inexpressible(t, fmt) is None
    ]


def nearest_expressible(study: StudyLike, trial: StoredTrial, fmt: str) -> StoredTrial | None:
    """The trial ``fmt`` can express nearest ``trial``: the fewest settings changed (the same configuration in
    another compute dtype first), then the nearest objectives (each scaled to [0, 1] over the candidates); None when
    ``fmt`` can express no complete trial."""
    candidates = _expressible_trials(snapshot(study), fmt)
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


def pick_trial(
    study: StudyLike, *, number: int | None = None, pick: Pick = "knee", fmt: str | None = None
) -> StoredTrial:
    """The trial to export: trial ``number``, or the front's ``knee``, ``min-memory`` or ``most-stable`` point.
    ``most-stable`` treats the stability objective's noise as a tie: among the trials whose interval overlaps the
    most stable one's (a stability margin within its seed noise), it takes the least memory.

    A pick prefers confirmed trials: when some trials of the front completed their confirmation (``sweep confirm``),
    the pick is made among those; a trial that failed its confirmation is never picked nor exported. With ``fmt``, a
    pick is made on the front of the trials that format can express (:func:`inexpressible`: LLaMA-Factory has no
    float32 compute, axolotl no fractional ``lora_alpha``), and trial ``number`` is refused when the format cannot
    express it, naming the nearest trial it can (:func:`nearest_expressible`).

    Raises:
        StudyError: No such trial, the trial did not complete or failed its confirmation (its status and reason are
            named), the format cannot express it, or the study has no complete trial (that the format can express)
            that did not fail its confirmation.
    """
    if number is not None:
        return _numbered_trial(snapshot(study), number, fmt)
    study = snapshot(study)
    name = study.name
    declared = study.objectives
    front = study.front
    if not front:
        raise StudyError(f"{name}: --pick: the study has no complete trial to export; run more trials with 'sweep run'")
    if fmt is not None and any(inexpressible(t, fmt) for t in front):
        expressible = study.non_dominated(_expressible_trials(study, fmt))
        if not expressible:
            limit = export_format(fmt).limit
            why, fix = (limit.every, limit.fix) if limit else ("", "")  # a limit made some trial inexpressible
            raise StudyError(
                f"{name}: --format {fmt}: no complete trial of the study can be expressed in it ({why}); export "
                f"with --format {_formats_expressing(front[0], fmt)}, or {fix}"
            )
        front = expressible
    passed = [t for t in front if t.confirmation is not None and t.confirmation.passed]
    usable = [t for t in front if t.confirmation is None or t.confirmation.passed]
    if not usable:
        _refuse_failed_confirmation(name, front[0], "--pick")
    front = passed or usable
    if pick != "min-memory":  # no trial is recommended as safest because it barely learns
        front = study.learning(front)
    memory = next(i for i, o in enumerate(declared) if o.role == "memory")
    stability = next(i for i, o in enumerate(declared) if o.role == "stability")

    def signed(t: StoredTrial, i: int) -> float:
        return declared[i].better(objectives(t)[i])

    if pick == "min-memory":
        return min(front, key=lambda t: (signed(t, memory), signed(t, stability)))
    if pick == "most-stable":  # the least memory among the trials tied with the most stable one
        best = min(front, key=lambda t: (signed(t, stability), signed(t, memory)))
        tied = [t for t in front if t.number in study.tied_on_stability(best, front)]
        return min([best, *tied], key=lambda t: (signed(t, memory), signed(t, stability)))
    return knee(front, declared)


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
        reason = t.user_attrs.get("reason", "no result")
        raise StudyError(
            f"{name}: --trial: trial {number} did not complete ({t.status_name}: {reason}); export a "
            "complete trial, e.g. --pick knee"
        )
    _refuse_failed_confirmation(name, t, "--trial")
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


def _refuse_failed_confirmation(study_name: str, trial: StoredTrial, flag: str) -> None:
    """Raise when ``trial``'s long run failed: its short result does not hold at the horizon of a real run."""
    done = trial.confirmation
    if done is None or done.passed:
        return
    where = f" at step {done.fail_step}" if done.fail_step is not None else ""
    raise StudyError(
        f"{study_name}: {flag}: trial {trial.number} failed its confirmation ({done.status}{where} of {done.steps} "
        f"steps: {done.reason}); export a trial whose long run completed, or confirm another with 'sweep confirm "
        f"{study_name} --front'"
    )
