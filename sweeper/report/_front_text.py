"""The front as text: its table (with the picks off it and the stability ties), its axis, and the notes on a
study's older instability and its other setups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sweeper.notation import format_chance, format_headroom, format_instability
from sweeper.report._console import _fmt, _table, format_progress, margin_text
from sweeper.stability import DEFAULT_HORIZON_STEPS
from sweeper.study import Objective, StoredTrial, StudySnapshot, ties_on_stability


def format_front(
    front: Sequence[StoredTrial],
    objectives: Sequence[Objective] = (),
    picks: Mapping[str, StoredTrial] | None = None,
) -> str:
    """The Pareto front as a table: trial, r, lora_alpha, compute dtype, double quant, quant type, batch,
    max_seq_length, peak GiB, stability margin (``>=`` when capped), headroom (``predicted_max_lr /
    learning_rate``, how many times its rate the edge lies, with its interval and the call when it is not safe:
    :class:`sweeper.stability.Headroom`), the chance of diverging within the study's horizon with its interval and
    call (``P(diverge@H)``, H the study's ``confirm_steps``, else 400: :func:`sweeper.notation.format_chance`),
    learning progress (the probe loss's drop at
    the trial's rate, ``barely`` under :data:`sweeper.stability._progress.LEARNING_PROGRESS_SHARE` of the front's best),
    instability (the values come from each trial's stored config); a column for each objective of ``objectives``
    that is neither the memory nor the stability one (a registered third objective, shown by its
    :attr:`~sweeper.study.Objective.shown`); when two of them are tied on stability (their intervals overlap), a
    column ``tied`` naming the trials each is tied with; when any of them packs its rows, a column ``packing`` after
    ``max_seq_length`` (``yes``/``no``); when any of them was confirmed (``sweep confirm``), a last
    column ``confirmed``: ``300 ok``, ``diverged@120`` ..., or ``-``.

    ``picks`` (pick name -> trial, :func:`sweeper.report._picks_data.picks_block`) adds a column ``pick``; a picked
    trial off the front (``safe`` chooses among every complete trial) gets a row marked ``off the front``."""
    front, extra = _with_picks_off_front(front, picks or {})
    rows: list[tuple[str, ...]] = [
        (
            "trial",
            "r",
            "lora_alpha",
            "compute",
            "double_quant",
            "quant",
            "batch",
            "max_seq_length",
            "peak_GiB",
            "margin",
            "headroom",
            f"P(diverge@{_horizon(front)})",
            "learns",
            "instability",
            *(o.name for o in objectives if o.role is None),
        )
    ]
    best = max((t.result.constant.learning_progress or 0.0 for t in front), default=0.0)
    rows += [_front_row(t, objectives, best) for t in front]
    # packed rows fill max_seq_length, padded ones the data's longest: a front holding any says which each is
    if any(t.config and t.config.packing for t in front):
        column = ["packing"] + ["yes" if t.config and t.config.packing else "no" for t in front]
        at = rows[0].index("max_seq_length") + 1
        rows = [(*row[:at], label, *row[at:]) for row, label in zip(rows, column)]
    ties = stability_ties(front, objectives)
    if any(ties.values()):
        column = ["tied"] + [",".join(f"#{n}" for n in ties.get(t.number, ())) or "-" for t in front]
        rows = [(*row, label) for row, label in zip(rows, column)]
    if any(t.confirmation is not None for t in front):
        labels = ["confirmed"] + [t.confirmation.label if t.confirmation else "-" for t in front]
        rows = [(*row, label) for row, label in zip(rows, labels)]
    if picks:
        rows = [(*row, label) for row, label in zip(rows, _pick_column(front, picks, extra))]
    return _table(rows)


def _front_row(t: StoredTrial, objectives: Sequence[Objective], best: float) -> tuple[str, ...]:
    """One trial's row of :func:`format_front` before its optional columns: its number, settings (from its stored
    config), peak, margin, headroom, learning progress (against the front's ``best``), instability and each extra
    objective."""
    c = t.config
    settings = (
        (
            c.r,
            t.lora_alpha,
            c.bnb_4bit_compute_dtype,
            c.bnb_4bit_use_double_quant,
            c.bnb_4bit_quant_type,
            c.per_device_train_batch_size,
            c.max_seq_length,
        )
        if c is not None
        else (None, t.lora_alpha, None, None, None, None, None)
    )
    values = t.values or (float("nan"), float("nan"))
    return (
        str(t.number),
        *(_fmt(v) for v in settings),
        f"{values[0]:.3f}",
        margin_text(t.result.stress),
        format_headroom(t.headroom),
        format_chance(t.stability),
        format_progress(t.result.constant.learning_progress, best),
        format_instability(t.result.constant.instability),
        *(
            o.shown(t.result, t.values[i]) if t.values is not None else "-"
            for i, o in enumerate(objectives)
            if o.role is None
        ),
    )


def _horizon(front: Sequence[StoredTrial]) -> int:
    """The horizon the front's chances are given at: the first measured trial's (one per study)."""
    return next(
        (t.stability.horizon_steps for t in front if t.stability.horizon_steps is not None), DEFAULT_HORIZON_STEPS
    )


def _with_picks_off_front(
    front: Sequence[StoredTrial], picks: Mapping[str, StoredTrial]
) -> tuple[Sequence[StoredTrial], set[int]]:
    """``front`` with the picked trials not on it added, in order of peak memory, and the numbers of those added."""
    on_front = {t.number for t in front}
    extra = {t.number: t for t in picks.values() if t.number not in on_front}
    if not extra:
        return front, set()
    return sorted([*front, *extra.values()], key=lambda t: (t.values or (float("inf"),))[0]), set(extra)


def _pick_column(rows: Sequence[StoredTrial], picks: Mapping[str, StoredTrial], off_front: set[int]) -> list[str]:
    """The front table's ``pick`` column: its header, then per row the picks choosing it (``-`` for none), marked
    ``(off the front)`` for the trials numbered in ``off_front``."""
    named = [", ".join(name for name, p in picks.items() if p.number == t.number) for t in rows]
    return ["pick"] + [(f"{n} (off the front)" if t.number in off_front else n) or "-" for n, t in zip(named, rows)]


def stability_ties(front: Sequence[StoredTrial], objectives: Sequence[Objective]) -> dict[int, list[int]]:
    """For each COMPLETE trial of ``front``, the others whose stability objective's interval overlaps its own (the
    rule the front and the picks use: :func:`sweeper.study.ties_on_stability`): a difference within the noise. Empty
    lists without a stability objective."""
    rows = ties_on_stability(front, front, objectives)
    return {t.number: row for t, row in zip(front, rows) if t.values is not None}


def legacy_instability_warning(study: StudySnapshot) -> str | None:
    """One line when the study mixes, or holds, instabilities of sweeper 0.1.0's definition
    (:attr:`sweeper.study.StoredTrial.legacy_instability`), else None."""
    old = [t.number for t in study.measured if t.legacy_instability]
    if not old:
        return None
    shown = ", ".join(map(str, old[:8])) + (f" and {len(old) - 8} more" if len(old) > 8 else "")
    return (
        f"WARNING instability: {len(old)} trial{'s' if len(old) > 1 else ''} of this study ({shown}) measured it with "
        "sweeper 0.1.0's definition (the training loss's spikes, which a run that learns nothing scores ~0.6 on), "
        "not the probe's: the front compares the two; start a new study (sweep run --study NAME) to compare like "
        "with like"
    )


def other_setups_line(study: StudySnapshot) -> str | None:
    """One line when the study holds measured trials of setups other than its current one: how many, what differs
    (each other setup's settings against the current one's, :meth:`sweeper.study.StudySnapshot.other_setups`), and
    that they are kept apart; else None."""
    mine, others = study.other_setups()
    if not others:
        return None
    parts = [
        f"{n} under settings this version cannot tell" if changed is None else f"{n} with {', '.join(changed)}"
        for n, changed in others
    ]
    total = sum(n for n, _ in others)
    return (
        f"note    {total} measured trial{'s' if total != 1 else ''} of this study {'were' if total != 1 else 'was'} "
        f"measured under other settings ({'; '.join(parts)}): kept apart, the front, the picks and the exports "
        f"compare the {mine} of the current settings"
    )


def front_axis(study: StudySnapshot) -> str:
    """``stability margin``, or ``instability`` for a study written before the margin: the front's second axis;
    ``stability margin vs learning progress`` in a study with ``learning_progress`` as its third."""
    objectives = study.objectives
    axis = "stability margin" if any(o.name == "edge_proximity" for o in objectives) else "instability"
    return axis + (" vs learning progress" if any(o.role == "learning" for o in objectives) else "")
