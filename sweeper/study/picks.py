"""The picks: which trial of a study ``sweep export``, ``sweep report`` and ``sweep confirm`` mean by ``safe``,
``knee``, ``min-memory`` and ``most-stable``, decided once, here: :func:`choose` takes a snapshot and a :class:`Pick`
and returns a :class:`PickOutcome` (the trial, what it chose among, the notes its line carries, or the refusal as
data). The export narrows the trials to those its format can express (:class:`Within`); the report and the export
write the outcome's line; confirm takes the trial.

A public module beside the face (:mod:`sweeper.study`): the readers (report, export) and the sweep's long runs each
read it, and none of them decides a pick on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sweeper.errors import StudyError
from sweeper.notation import edge_phrase, format_chance, format_headroom
from sweeper.stability import SLOW_LEARNING_SHARE
from sweeper.study._front import by_knee_distance
from sweeper.study._objectives import MEMORY_NOISE_SHARE, Objective
from sweeper.study._snapshot import StudySnapshot
from sweeper.study._stored import StoredTrial
from sweeper.trial import TrialStatus


class Pick(str, enum.Enum):
    """What a pick is for (``sweep export --pick``): the rules are :func:`choose`'s."""

    SAFE = "safe"
    KNEE = "knee"
    MIN_MEMORY = "min-memory"
    MOST_STABLE = "most-stable"


#: The picks by name, in the order every view lists them.
PICKS: tuple[str, ...] = tuple(p.value for p in Pick)

#: What each pick is for, as a note names it.
_CRITERION = {
    Pick.MIN_MEMORY: "memory",
    Pick.MOST_STABLE: "stability",
    Pick.KNEE: "memory and stability",
    Pick.SAFE: "safety",
}


@dataclass(frozen=True, kw_only=True)
class Within:
    """The trials a pick may choose among, narrowed to those an export format can express.

    Attributes:
        fmt: The format's name, as the pick's line says it (``the front of the trials axolotl can express (3)``).
        cannot_express: Why the format cannot train a trial as it ran, or None when it can
            (:meth:`sweeper.export._format.ExportFormat.cannot_express`).
    """

    fmt: str
    cannot_express: Callable[[StoredTrial], str | None]


@dataclass(frozen=True, kw_only=True)
class PickOutcome:
    """What a pick made of a study: the trial it chose, what it chose among and what the user should know about it;
    or, when it cannot be made, why (the refusal as data: no trial).

    Attributes:
        pick: The pick.
        study: The study's name.
        trial: The chosen trial; None when the pick is refused.
        among: What it chose among, as the line says it: ``the front's 5 trials``, ``the 2 confirmed trials of the
            front``, ``the front of the trials axolotl can express (3)``; empty when refused.
        notes: What else the line says: a better trial left out because it is unconfirmed, a trial that learns
            less than half as fast as a safe alternative, a trial near its edge, no safe trial.
        refusal: Why no trial can be picked, with its fix (``trial 0 failed its confirmation (...); export a trial
            whose long run completed, ...``); None when a trial was picked.
    """

    pick: Pick
    study: str
    trial: StoredTrial | None
    among: str = ""
    notes: tuple[str, ...] = ()
    refusal: str | None = None

    @property
    def line(self) -> str:
        """``safe #3, among the front's 5 trials; #0 uses 0.080 GiB less and is unconfirmed``, or for a refused pick
        ``knee: none: trial 0 failed its confirmation (...)``."""
        if self.trial is None:
            return f"{self.pick.value}: none: {self.refusal}"
        return "; ".join([f"{self.pick.value} #{self.trial.number}, among {self.among}", *self.notes])

    def chosen(self, flag: str = "--pick") -> StoredTrial:
        """The chosen trial.

        Raises:
            StudyError: The pick was refused: ``STUDY: FLAG: <refusal>``.
        """
        if self.trial is None:
            raise StudyError(f"{self.study}: {flag}: {self.refusal}")
        return self.trial


def objectives(trial: StoredTrial) -> tuple[float, ...]:
    """The objective values of a COMPLETE trial (the front and the exported trials are), in the study's order
    (:func:`sweeper.study.study_objectives`): ``(peak_memory_gib, edge_proximity)`` by default,
    ``(peak_memory_gib, instability)`` in a study written before the stability margin.

    Raises:
        StudyError: The trial did not complete.
    """
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


def confirmation_refusal(study_name: str, trial: StoredTrial) -> str | None:
    """Why ``trial`` cannot be picked or exported because its long run failed (its short result does not hold at the
    horizon of a real run), with the fix; None when it did not fail one."""
    done = trial.confirmation
    if done is None or done.passed:
        return None
    where = f" at step {done.fail_step}" if done.fail_step is not None else ""
    return (
        f"trial {trial.number} failed its confirmation ({done.status}{where} of {done.steps} steps: {done.reason}); "
        f"export a trial whose long run completed, or confirm another with 'sweep confirm {study_name} --front'"
    )


def complete_trials(study: StudySnapshot, within: Within | None = None) -> list[StoredTrial]:
    """The measured COMPLETE trials of the study's current setup (repeats stand for their original), those
    ``within`` can express when it is given."""
    return [
        t
        for t in study.current(study.trials)
        if t.status == TrialStatus.COMPLETE
        and t.values is not None
        and not t.is_repeat
        and (within is None or within.cannot_express(t) is None)
    ]


def choose(
    study: StudySnapshot, pick: Pick | str = Pick.SAFE, within: Within | None = None, *, prefer_confirmed: bool = True
) -> PickOutcome:
    """The trial a pick chooses, with what it chose among and the notes its line carries, or its refusal.

    The rules (``sweep export --help``, docs/contract.md, the report):

    - **Among what.** The front of the study's current setup; with ``within``, the front of the trials that format
      can express (LLaMA-Factory has no float32 compute, axolotl no fractional ``lora_alpha``; the caller refuses a
      format that can express none). A trial that failed its confirmation is never picked. When some trials of the
      front completed their confirmation (``sweep confirm``), every pick is made among those (``safe``: among the
      confirmed trials safely below their edge), and its line names the unconfirmed trial the pick would take
      otherwise. ``knee``, ``most-stable`` and ``safe`` leave out trials that barely learn
      (:func:`sweeper.stability.barely_learns`).
    - ``min-memory``: the least peak memory.
    - ``knee``: the compromise point (:func:`knee`).
    - ``most-stable``: the least memory among the trials tied with the most stable one (a stability margin within
      its seed noise).
    - ``safe`` (``sweep export``'s default), among every complete trial of the current setup, not only the front (a
      safe trial whose margin is within the seed noise of a lighter trial near its edge is off the front, and is
      what a user wants): :func:`safe_choice`.
    - A ``knee`` or ``most-stable`` pick that learns less than half as fast as a safe trial, and any pick near its
      edge, says so on its line.

    ``prefer_confirmed`` False makes the pick among every trial of the front that did not fail its confirmation, as
    ``sweep confirm --pick`` chooses what to confirm next.

    Raises:
        ValueError: ``pick`` is not a :class:`Pick`.
    """
    pick = Pick(pick)
    front = study.front
    if not front:
        refusal = "the study has no complete trial to export; run more trials with 'sweep run'"
        return PickOutcome(pick=pick, study=study.name, trial=None, refusal=refusal)
    among = f"the front's {len(front)} trial{'s' if len(front) != 1 else ''}"
    if within is not None and any(within.cannot_express(t) for t in front):
        front = study.non_dominated([t for t in complete_trials(study, within) if _not_failed(t)])
        among = f"the front of the trials {within.fmt} can express ({len(front)})"
    complete = complete_trials(study, within)
    if pick == Pick.SAFE:  # a safe trial tied on stability with a lighter one near its edge is off the front, not out
        front = complete or front
        narrowed = within is not None and len(complete) < len(complete_trials(study))
        among = f"the {len(front)} complete trial{'s' if len(front) != 1 else ''}" + (
            f" {within.fmt} can express" if narrowed and within is not None else ""
        )
    passed = [t for t in front if t.confirmation is not None and t.confirmation.passed] if prefer_confirmed else []
    if pick == Pick.SAFE:  # a confirmed trial near its edge is no reason to pass over a safe one
        passed = [t for t in passed if t.safely_below_edge]
    usable = [t for t in front if _not_failed(t)]
    if not usable:
        return PickOutcome(pick=pick, study=study.name, trial=None, refusal=confirmation_refusal(study.name, front[0]))
    safe_pool = [t for t in complete if _not_failed(t)]
    chosen, notes, among = _prefer_confirmed(study, pick, passed, usable, safe_pool, among)
    headroom = chosen.headroom
    if pick != Pick.SAFE and headroom is not None and headroom.near_edge:
        notes.append(_edge_note(chosen))
    return PickOutcome(pick=pick, study=study.name, trial=chosen, among=among, notes=tuple(notes))


def choose_all(study: StudySnapshot) -> dict[str, PickOutcome]:
    """Every pick's outcome (:func:`choose`), by pick name, in :data:`PICKS`' order; {} without a complete trial."""
    return {p.value: choose(study, p) for p in Pick} if study.front else {}


def safe_choice(study: StudySnapshot, trials: Sequence[StoredTrial]) -> tuple[StoredTrial, str | None]:
    """The ``safe`` pick's rule among ``trials`` (COMPLETE, non-empty): of those safely below their edge
    (:attr:`StoredTrial.headroom` not :attr:`~sweeper.stability.Headroom.near_edge`) that learn at least
    :data:`~sweeper.stability.SLOW_LEARNING_SHARE` as fast as the fastest of them, those within
    :data:`~sweeper.study._objectives.MEMORY_NOISE_SHARE` of the least memory, and of those the one that learns
    most (then the least memory). With no safe trial, the most headroom, and the line that says so (else None).

    Raises:
        ValueError: ``trials`` is empty.
    """
    if not trials:
        raise ValueError("no trial to pick from")
    memory = next(i for i, o in enumerate(study.objectives) if o.role == "memory")

    def peak(t: StoredTrial) -> float:
        return t.values[memory] if t.values is not None else float("inf")

    def progress(t: StoredTrial) -> float:
        return t.result.constant.learning_progress or 0.0

    safe = [t for t in trials if t.safely_below_edge]
    if not safe and all(t.headroom is None for t in trials):
        # a study written before the margin measured no headroom: the least memory, and a line that says why
        best = min(trials, key=lambda t: (peak(t), t.number))
        return best, "no trial has a measured headroom (a study written before the stress phase): took the least memory"
    if not safe:
        best = max(trials, key=lambda t: (t.headroom.value if t.headroom is not None else -1.0, -peak(t)))
        if best.headroom is None:
            return best, "no trial is safely below its edge: took the most headroom, near its edge"
        return best, f"no trial is safely below its edge: took the most headroom, {_edge_note(best)}"
    fastest = max(progress(t) for t in safe)
    # When even the fastest does not learn (its probe loss rose: a negative progress), no share of it is a bar.
    learners = [t for t in safe if progress(t) >= SLOW_LEARNING_SHARE * fastest] if fastest > 0 else safe
    least = min(peak(t) for t in learners)
    within = [t for t in learners if peak(t) <= least * (1 + MEMORY_NOISE_SHARE)]
    return max(within, key=lambda t: (progress(t), -peak(t), -t.number)), None


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


def _edge_note(trial: StoredTrial) -> str:
    """The note of a pick not called safe: above its edge (predicted to fail at its own rate) when the headroom is
    below 1, else its call; its chance of diverging within the study's horizon, and the rate that would be safe."""
    headroom = trial.headroom
    assert headroom is not None
    shown = format_headroom(headroom, mark=False)
    note = f"{edge_phrase(headroom)} (headroom {shown})"
    if headroom.value < 1:
        note += ": predicted to fail at its own learning rate"
    figures = trial.stability
    if figures.p_diverge is not None:
        note += f"; P(diverges within {figures.horizon_steps} steps) {format_chance(figures, call=False)}"
    if figures.safe_learning_rate is not None:
        note += f"; safe at learning_rate {figures.safe_learning_rate:.3g}"
    return note


def _progress(t: StoredTrial) -> float | None:
    return t.result.constant.learning_progress


def _apply(
    study: StudySnapshot, pick: Pick, front: list[StoredTrial], safe_pool: list[StoredTrial]
) -> tuple[StoredTrial, list[str]]:
    """The pick's rule on ``front`` (non-empty): the trial and the notes on it (:func:`choose`); ``safe_pool``: the
    complete trials a "learns less than half as fast as a safe trial" note compares with."""
    declared = study.objectives
    if pick != Pick.MIN_MEMORY:  # no trial is recommended as safest because it barely learns
        front = study.learning(front)
    memory = next(i for i, o in enumerate(declared) if o.role == "memory")
    stability = next(i for i, o in enumerate(declared) if o.role == "stability")

    def signed(t: StoredTrial, i: int) -> float:
        return declared[i].better(objectives(t)[i])

    safe = [t for t in study.learning(safe_pool or front) if t.safely_below_edge]
    fastest = max((p for t in safe if (p := _progress(t)) is not None), default=None)
    notes: list[str] = []
    if pick == Pick.SAFE:
        chosen, note = safe_choice(study, front)
        return chosen, [note] if note else []
    if pick == Pick.MIN_MEMORY:
        chosen = min(front, key=lambda t: (signed(t, memory), signed(t, stability)))
    elif pick == Pick.MOST_STABLE:  # the least memory among the trials tied with the most stable one
        best = min(front, key=lambda t: (signed(t, stability), signed(t, memory)))
        tied_numbers = set(study.tied_on_stability(best, front))
        tied = [t for t in front if t.number in tied_numbers]
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


def _as_good(study: StudySnapshot, pick: Pick, confirmed: StoredTrial, best: StoredTrial) -> bool:
    """Whether the confirmed trial a pick prefers is as good as the pick made among every trial (``best``), within
    the noise, on what the pick is for: memory (within the seed's 10% on peak memory) for ``min-memory``, stability
    (overlapping margin intervals) for ``most-stable``, both for ``knee``. A confirmation is worth a tie, not a worse
    trial: the front's least stable point must never be the ``most-stable`` pick because it alone was confirmed.
    ``safe`` chose among confirmed trials that are safely below their edge already: as good."""
    if pick == Pick.SAFE:
        return True
    light = study.as_light_within_noise(confirmed, best)
    i = next(i for i, o in enumerate(study.objectives) if o.role == "stability")
    objective = study.objectives[i]
    more_stable = objective.better(objectives(confirmed)[i]) <= objective.better(objectives(best)[i])
    stable = more_stable or best.number in study.tied_on_stability(confirmed, [best])
    if pick == Pick.MIN_MEMORY:
        return light
    if pick == Pick.MOST_STABLE:
        return stable
    return light and stable


def _unconfirmed_note(study_name: str, pick: Pick, chosen: StoredTrial, other: StoredTrial) -> str:
    """What the pick would take without preferring confirmed trials, said on its line."""
    if pick == Pick.MIN_MEMORY:
        less = objectives(chosen)[0] - objectives(other)[0]
        return f"#{other.number} uses {less:.3f} GiB less and is unconfirmed"
    return (
        f"#{other.number} would be the {pick.value} pick and is unconfirmed (sweep confirm {study_name} --trials "
        f"{other.number})"
    )


def _not_failed(trial: StoredTrial) -> bool:
    return trial.confirmation is None or trial.confirmation.passed
