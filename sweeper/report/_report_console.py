"""What ``sweep report`` prints on the terminal: the front table, the counts by status and NaN cause, stale trials,
the study's notes, the picks, what fit and the memory predictions (its ``--json`` is
:meth:`sweeper.report._records.Report.to_dict`). Text only: the command prints it.
"""

from __future__ import annotations

from pathlib import Path

from sweeper.report._data import counts_with_stale, describe_fit, fit_map_data, memory_prediction_data
from sweeper.report._data_text import format_counts
from sweeper.report._front_text import format_front, front_axis, legacy_instability_warning, other_setups_line
from sweeper.report._memory_text import format_cap, format_memory_prediction, format_same_rows
from sweeper.report._picks_data import picks_block
from sweeper.study import StudySnapshot


def report_lines(study: StudySnapshot, ref: str) -> list[str]:
    """``sweep report STUDY``'s lines (before the HTML report is written): the Pareto front
    (:func:`sweeper.report._front_text.format_front`), the trials by status (stale RUNNING ones apart, one line each),
    the notes on a 0.1.0 instability and on other setups, the picks (or why there is none), the largest
    ``max_seq_length`` that fit per batch size and the memory predictions' error.

    Args:
        study: The study, as read once.
        ref: How the user named the study, for the ``sweep export REF`` the picks line suggests.
    """
    front = study.front
    plural = "s" if len(front) != 1 else ""
    chosen_trials, pick_block = picks_block(study, ref)
    lines = [
        f"study '{study.name}': Pareto front (peak memory vs {front_axis(study)}), {len(front)} trial{plural}:",
        format_front(front, study.objectives, chosen_trials) if front else "  (no complete trial)",
        "",
        "trials: " + format_counts(counts_with_stale(study), study.nan_causes),
    ]
    for line in study.stale_running.values():
        lines.append(f"stale   {line}; the next 'sweep run' of this study records it as interrupted and runs it again")
    lines += [note for note in (legacy_instability_warning(study), other_setups_line(study)) if note]
    lines += pick_block
    fits = describe_fit(fit_map_data(study))
    if fits:
        lines.append("largest max_seq_length that fit: " + ", ".join(f"batch {b}: {s}" for b, s in fits.items()))
    configs = [(t.params, t.config) for t in study.trials if t.config is not None]
    same = format_same_rows(
        [p.get("max_seq_length", c.max_seq_length) for p, c in configs],  # a repeat stores its original's config
        study.longest_sample_tokens,
        sorted({c.packing for _, c in configs}),
    )
    if same:
        lines.append(same)
    memory = format_memory_prediction(memory_prediction_data(study))
    if memory:
        lines.append(memory)
    limits = [t.config.memory_limit_gib for t in study.current(study.measured) if t.config is not None]
    if limits and study.cards:
        caps = [format_cap(max(limits), False, name, gib, device) for name, (device, gib) in study.cards.items()]
        lines.append("memory  " + "; ".join(caps))
    return lines


def report_written_line(path: Path) -> str:
    """The line after the HTML report was written to ``path``."""
    return f"report  {path} (self-contained, opens offline)"
