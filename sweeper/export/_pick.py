"""Which trial ``sweep export`` writes: trial N, or the front's safe (the default), knee, min-memory or most-stable
point, among the trials the format can express and that did not fail their confirmation, with what each pick chose
among (:class:`PickChoice`); and the one-line refusals otherwise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sweeper.errors import StudyError
from sweeper.export._registry import EXPORT_FORMATS, export_format
from sweeper.stability import SLOW_LEARNING_SHARE, Headroom, format_headroom, format_margin
from sweeper.study import (
    Objective,
    StoredTrial,
    StudyLike,
    StudySnapshot,
    by_knee_distance,
    snapshot,
)
from sweeper.trial import TrialStatus

Pick = Literal["safe", "knee", "min-memory", "most-stable"]
PICKS: tuple[str, ...] = ("safe", "knee", "min-memory", "most-stable")


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
    """The measured COMPLETE trials of the study's current setup ``fmt`` can express (:func:`_complete_trials`)
    whose confirmation did not fail."""
    return [t for t in _complete_trials(study, fmt) if t.confirmation is None or t.confirmation.passed]


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


@dataclass(frozen=True, kw_only=True)
class PickChoice:
    """The trial a pick chose, what it chose among and what the user should know about it.

    Attributes:
        pick: ``knee``, ``min-memory``, ``most-stable`` or ``safe``.
        trial: The chosen trial.
        among: What it chose among, as the line says it: ``the front's 5 trials``, ``the 2 confirmed trials of the
            front``, ``the front of the trials axolotl can express (3)``.
        notes: What else the line says: a better trial left out because it is unconfirmed, a trial that learns
            less than half as fast as a safe alternative, a trial near its edge, no safe trial.
    """

    pick: str
    trial: StoredTrial
    among: str
    notes: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        """``safe #3, among the front's 5 trials; #0 uses 0.080 GiB less and is unconfirmed``."""
        return "; ".join([f"{self.pick} #{self.trial.number}, among {self.among}", *self.notes])


def pick_trial(
    study: StudyLike, *, number: int | None = None, pick: Pick = "safe", fmt: str | None = None
) -> StoredTrial:
    """The trial to export: trial ``number``, or the front's ``safe``, ``knee``, ``min-memory`` or ``most-stable``
    point (:func:`choose`, whose rules this follows).

    Raises:
        StudyError: No such trial, the trial did not complete or failed its confirmation (its status and reason are
            named), the format cannot express it, or the study has no complete trial (that the format can express)
            that did not fail its confirmation.
    """
    if number is not None:
        return _numbered_trial(snapshot(study), number, fmt)
    return choose(study, pick, fmt).trial


def choose(
    study: StudyLike, pick: Pick = "safe", fmt: str | None = None, *, prefer_confirmed: bool = True
) -> PickChoice:
    """The front's point a pick chooses, with what it chose among and the notes its line carries.

    The rules (``sweep export --help``, docs/contract.md, the report):

    - **Among what.** The front of the study's current setup; with ``fmt``, the front of the trials that format can
      express (:func:`inexpressible`: LLaMA-Factory has no float32 compute, axolotl no fractional ``lora_alpha``).
      A trial that failed its confirmation is never picked. When some trials of the front completed their
      confirmation (``sweep confirm``), every pick is made among those (``safe``: among the confirmed trials safely
      below their edge), and its line names the unconfirmed trial the pick would take otherwise. ``knee``,
      ``most-stable`` and ``safe`` leave out trials that barely learn (:func:`sweeper.stability.barely_learns`).
    - ``min-memory``: the least peak memory.
    - ``knee``: the compromise point (:func:`knee`).
    - ``most-stable``: the least memory among the trials tied with the most stable one (a stability margin within
      its seed noise).
    - ``safe`` (``sweep export``'s default), among every complete trial of the current setup, not only the front (a
      safe trial whose margin is within the seed noise of a lighter trial near its edge is off the front, and is
      what a user wants): among the trials safely below their edge (headroom, ``predicted_max_lr
      / learning_rate``, at or above its safety factor: :class:`sweeper.stability.Headroom`) that learn at least
      half as fast as the fastest of them (:data:`sweeper.stability.SLOW_LEARNING_SHARE`), those within 10% (the
      seed's noise on peak memory, :data:`sweeper.study._objectives.MEMORY_NOISE_SHARE`) of the
      least memory; of those the one that learns most. With no safe trial, the most headroom, said on its line.
    - A ``knee`` or ``most-stable`` pick that learns less than half as fast as a safe trial, and any pick near its
      edge, says so on its line.

    ``prefer_confirmed`` False makes the pick among every trial of the front that did not fail its confirmation, as
    ``sweep confirm --pick`` chooses what to confirm next.

    Raises:
        StudyError: The study has no complete trial (that ``fmt`` can express) that did not fail its confirmation.
        ValueError: ``pick`` is none of :data:`PICKS`.
    """
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {PICKS}, but got {pick!r}")
    study = snapshot(study)
    name = study.name
    front = study.front
    if not front:
        raise StudyError(f"{name}: --pick: the study has no complete trial to export; run more trials with 'sweep run'")
    among = f"the front's {len(front)} trial{'s' if len(front) != 1 else ''}"
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
        among = f"the front of the trials {fmt} can express ({len(front)})"
    complete = _complete_trials(study, fmt)
    if pick == "safe":  # a safe trial tied on stability with a lighter one near its edge is off the front, not out
        front = complete or front
        narrowed = fmt is not None and len(complete) < len(_complete_trials(study, None))
        among = f"the {len(front)} complete trial{'s' if len(front) != 1 else ''}" + (
            f" {fmt} can express" if narrowed else ""
        )
    passed = [t for t in front if t.confirmation is not None and t.confirmation.passed] if prefer_confirmed else []
    if pick == "safe":  # a confirmed trial near its edge is no reason to pass over a safe one
        passed = [t for t in passed if t.safely_below_edge]
    usable = [t for t in front if t.confirmation is None or t.confirmation.passed]
    if not usable:
        _refuse_failed_confirmation(name, front[0], "--pick")
    safe_pool = [t for t in complete if t.confirmation is None or t.confirmation.passed]
    chosen, notes, among = _prefer_confirmed(study, pick, passed, usable, safe_pool, among)
    headroom = chosen.headroom
    if pick != "safe" and headroom is not None and headroom.near_edge:
        notes.append(_edge_note(headroom))
    return PickChoice(pick=pick, trial=chosen, among=among, notes=tuple(notes))


def _prefer_confirmed(
    study: StudySnapshot,
    pick: Pick,
    passed: list[StoredTrial],
    usable: list[StoredTrial],
    safe_pool: list[StoredTrial],
    among: str,
) -> tuple[StoredTrial, list[str], str]:
    """Of :func:`choose`: the pick among the confirmed trials ``passed`` when there are any and the one it takes is
    as good within the noise as the pick among every ``usable`` trial (:func:`_as_good`), said on its line with the
    unconfirmed trial it would take otherwise; else the pick among every trial, its line naming the confirmed one
    passed over. Returns ``(trial, notes, among)``."""
    chosen, notes = _apply(study, pick, passed or usable, safe_pool)
    if not passed or len(passed) == len(usable):
        return chosen, notes, among
    unrestricted, unrestricted_notes = _apply(study, pick, usable, safe_pool)
    if unrestricted.number == chosen.number or _as_good(study, pick, chosen, unrestricted):
        n = len(passed)
        if unrestricted.number != chosen.number:
            notes = [*notes, _unconfirmed_note(study.name, pick, chosen, unrestricted)]
        return chosen, notes, f"the {n} confirmed trial{'s' if n != 1 else ''} of {among}"
    # the confirmed trial is worse beyond the noise on what the pick is for: not a substitute
    passed_over = (
        f"unconfirmed (sweep confirm {study.name} --trials {unrestricted.number}); the confirmed #{chosen.number} is "
        f"not within the noise of it on {_CRITERION[pick]}"
    )
    return unrestricted, [*unrestricted_notes, passed_over], among


def _edge_note(headroom: Headroom) -> str:
    """The note of a pick near its edge: above it (predicted to fail at its own rate) when the headroom is below 1."""
    shown = format_headroom(headroom, mark=False)
    if headroom.value < 1:
        return f"{headroom.edge_phrase} (headroom {shown}): predicted to fail at its own learning rate"
    return f"{headroom.edge_phrase} (headroom {shown})"


def _progress(t: StoredTrial) -> float | None:
    return t.result.constant.learning_progress


def _complete_trials(study: StudySnapshot, fmt: str | None) -> list[StoredTrial]:
    """The measured COMPLETE trials of the study's current setup (repeats stand for their original), those ``fmt``
    can express when it is given."""
    return [
        t
        for t in study.current(study.trials)
        if t.status == TrialStatus.COMPLETE
        and t.values is not None
        and not t.is_repeat
        and (fmt is None or inexpressible(t, fmt) is None)
    ]


def _apply(
    study: StudySnapshot, pick: Pick, front: list[StoredTrial], safe_pool: list[StoredTrial]
) -> tuple[StoredTrial, list[str]]:
    """The pick's rule on ``front`` (non-empty): the trial and the notes on it (:func:`choose`); ``safe_pool``: the
    complete trials a "learns less than half as fast as a safe trial" note compares with."""
    declared = study.objectives
    if pick != "min-memory":  # no trial is recommended as safest because it barely learns
        front = study.learning(front)
    memory = next(i for i, o in enumerate(declared) if o.role == "memory")
    stability = next(i for i, o in enumerate(declared) if o.role == "stability")

    def signed(t: StoredTrial, i: int) -> float:
        return declared[i].better(objectives(t)[i])

    safe = [t for t in study.learning(safe_pool or front) if t.safely_below_edge]
    fastest = max((p for t in safe if (p := _progress(t)) is not None), default=None)
    notes: list[str] = []
    if pick == "safe":
        chosen, note = study.safe_pick(front)
        return chosen, [note] if note else []
    if pick == "min-memory":
        chosen = min(front, key=lambda t: (signed(t, memory), signed(t, stability)))
    elif pick == "most-stable":  # the least memory among the trials tied with the most stable one
        best = min(front, key=lambda t: (signed(t, stability), signed(t, memory)))
        tied = [t for t in front if t.number in study.tied_on_stability(best, front)]
        chosen = min([best, *tied], key=lambda t: (signed(t, memory), signed(t, stability)))
    else:
        chosen = knee(front, declared)
    mine = _progress(chosen)
    if fastest is not None and fastest > 0 and (mine is None or mine < SLOW_LEARNING_SHARE * fastest):
        faster = max(safe, key=lambda t: _progress(t) or 0.0)
        shown = "?" if mine is None else f"{100 * mine:.0f}%"
        notes.append(
            f"learns {shown}, less than half as fast as safe #{faster.number} ({100 * fastest:.0f}%): see --pick safe"
        )
    return chosen, notes


#: What each pick is for, as a note names it.
_CRITERION = {"min-memory": "memory", "most-stable": "stability", "knee": "memory and stability", "safe": "safety"}


def _as_good(study: StudySnapshot, pick: Pick, confirmed: StoredTrial, best: StoredTrial) -> bool:
    """Whether the confirmed trial a pick prefers is as good as the pick made among every trial (``best``), within
    the noise, on what the pick is for: memory (within the seed's 10% on peak memory) for ``min-memory``, stability
    (overlapping margin intervals) for ``most-stable``, both for ``knee``. A confirmation is worth a tie, not a worse
    trial: the front's least stable point must never be the ``most-stable`` pick because it alone was confirmed.
    ``safe`` chose among confirmed trials that are safely below their edge already: as good."""
    if pick == "safe":
        return True
    light = study.as_light_within_noise(confirmed, best)
    i = next(i for i, o in enumerate(study.objectives) if o.role == "stability")
    objective = study.objectives[i]
    more_stable = objective.better(objectives(confirmed)[i]) <= objective.better(objectives(best)[i])
    stable = more_stable or best.number in study.tied_on_stability(confirmed, [best])
    if pick == "min-memory":
        return light
    if pick == "most-stable":
        return stable
    return light and stable


def _unconfirmed_note(study_name: str, pick: Pick, chosen: StoredTrial, other: StoredTrial) -> str:
    """What the pick would take without preferring confirmed trials, said on its line."""
    if pick == "min-memory":
        less = objectives(chosen)[0] - objectives(other)[0]
        return f"#{other.number} uses {less:.3f} GiB less and is unconfirmed"
    return (
        f"#{other.number} would be the {pick} pick and is unconfirmed (sweep confirm {study_name} --trials "
        f"{other.number})"
    )


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
