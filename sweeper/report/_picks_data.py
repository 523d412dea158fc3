"""The picks as the report shows them: each pick's outcome (the trial or why none), its line, the block ``sweep
report`` prints, and the picks that sit off the front.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweeper.study import StoredTrial, StudySnapshot
from sweeper.study.picks import PickOutcome, choose_all


def pick_outcomes(study: StudySnapshot) -> dict[str, PickOutcome]:
    """What each ``sweep export --pick`` makes of the study (``safe``, ``knee``, ``min-memory``, ``most-stable``), by
    pick name (:func:`sweeper.study.picks.choose_all`): the trial, or the refusal (every trial it chooses among failed
    its confirmation); {} without a complete trial. Each pick is made once: :func:`pick_choices`, :func:`pick_lines`
    and :func:`no_picks_reason` read this."""
    return choose_all(study)


def pick_choices(outcomes: Mapping[str, PickOutcome]) -> dict[str, PickOutcome]:
    """The picks of :func:`pick_outcomes` that could be made."""
    return {name: o for name, o in outcomes.items() if o.trial is not None}


def pick_lines(outcomes: Mapping[str, PickOutcome]) -> dict[str, str]:
    """Each pick's line, by pick name (:attr:`sweeper.study.picks.PickOutcome.line`): ``safe #3, among ...``, or
    for a pick that cannot be made ``knee: none: trial 0 failed its confirmation (...)``."""
    return {name: o.line for name, o in outcomes.items()}


def picks_block(study: StudySnapshot, ref: str) -> tuple[dict[str, StoredTrial], list[str]]:
    """What the terminal says of the picks, made once: the trial each pick that can be made chooses (by pick name,
    for :func:`sweeper.report._front_text.format_front`'s ``pick`` column) and the lines (``picks   (sweep export REF
    writes safe; --pick NAME another)`` then one line per pick, or ``picks   none: ...``; none without a complete
    trial).

    Args:
        study: The study, as read once.
        ref: How the user named the study, for the ``sweep export REF`` the first line suggests.
    """
    outcomes = pick_outcomes(study)
    chosen = {name: choice.chosen() for name, choice in pick_choices(outcomes).items()}
    if why := no_picks_reason(study, outcomes):
        return chosen, [f"picks   none: {why}"]
    if lines := pick_lines(outcomes):
        return chosen, [f"picks   (sweep export {ref} writes safe; --pick NAME another)"] + [
            f"  {line}" for line in lines.values()
        ]
    return chosen, []


def picks(study: StudySnapshot) -> dict[str, int]:
    """The trial ``sweep export --pick`` would choose for each pick that can be made, by pick name."""
    return {name: choice.chosen().number for name, choice in pick_choices(pick_outcomes(study)).items()}


def no_picks_reason(study: StudySnapshot, outcomes: Mapping[str, PickOutcome] | None = None) -> str | None:
    """Why no pick can be made although the study has trials (every trial each pick chooses among failed its
    confirmation), as ``sweep export --pick`` says it; None when some pick can be made or it has no trial.
    ``outcomes``: the study's :func:`pick_outcomes` when the caller has them (else they are made here)."""
    outcomes = pick_outcomes(study) if outcomes is None else outcomes
    refused = [o for o in outcomes.values() if o.trial is None]
    if not refused or len(refused) != len(outcomes):
        return None
    return refused[0].refusal


def picked_off_front(study: StudySnapshot, picks: Mapping[str, int]) -> list[StoredTrial]:
    """The complete trials ``picks`` (trial numbers by pick name) chose that are not on the front (the ``safe`` pick
    can be: a safe trial tied on stability with a lighter one near its edge), by number: the tables show each on a
    row of its own, and the front rows' ``tied_with`` counts them."""
    wanted = set(picks.values()) - {t.number for t in study.front}
    return [t for t in study.trials if t.number in wanted and t.values is not None]
