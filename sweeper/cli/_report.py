"""``sweep report STUDY``: the front, counts by status and NaN cause, the fit frontier; ``--json``; the
HTML report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sweeper.cli._common import _print, _study_ref
from sweeper.errors import SpaceError, SweeperError


def cmd_report(args: argparse.Namespace) -> int:
    """``sweep report STUDY``: the front, counts by status and NaN cause, the fit frontier; ``--json``; the HTML."""
    import optuna

    from sweeper.report import (
        counts_with_stale,
        describe_fit,
        fit_map_data,
        format_counts,
        format_front,
        format_memory_prediction,
        front_axis,
        memory_prediction_data,
        no_picks_reason,
        picks,
        report_data,
        write_html_report,
    )
    from sweeper.study import (
        legacy_instability_warning,
        load_existing_study,
        other_setups_line,
        snapshot,
        stale_running,
        study_dir,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded, _ = load_existing_study(args.study)
    study = snapshot(loaded)  # read once: every part of the report reads this snapshot
    html_path = Path(args.html) if args.html else study_dir(study.name) / "report.html"
    if html_path.suffix.lower() not in (".html", ".htm") or html_path.is_dir():
        raise SpaceError(f"{args.html}: --html: the report is an HTML file; give a path ending in .html")
    if args.json:
        _print(json.dumps(report_data(study).to_dict(), indent=2))
    else:
        front = study.front
        _print(f"study '{study.name}': Pareto front (peak memory vs {front_axis(study)}), {len(front)} trials:")
        _print(format_front(front, study.objectives) if front else "  (no complete trial)")
        _print()
        _print("trials: " + format_counts(counts_with_stale(study), study.nan_causes))
        for line in stale_running(study.study).values():
            _print(f"stale   {line}; the next 'sweep run' of this study records it as interrupted and runs it again")
        for note in (legacy_instability_warning(study), other_setups_line(study)):
            if note:
                _print(note)
        chosen = picks(study)
        if not chosen and (why := no_picks_reason(study)):
            _print(f"picks   none: {why.split(': ', 2)[-1]}")
        if chosen:
            _print(
                "picks   "
                + " · ".join(f"{k} #{n}" for k, n in chosen.items())
                + f" (sweep export {_study_ref(args.study)} --pick knee)"
            )
        fits = describe_fit(fit_map_data(study))
        if fits:
            _print("largest max_seq_length that fit: " + ", ".join(f"batch {b}: {s}" for b, s in fits.items()))
        memory = format_memory_prediction(memory_prediction_data(study))
        if memory:
            _print(memory)
    if args.json and not args.html:
        return 0  # JSON for a script: no file unless --html asks for one
    try:
        write_html_report(study, html_path)
    except OSError as exc:
        raise SweeperError(
            [f"{html_path}: --html: cannot write the report ({exc.strerror}); choose a writable path"]
        ) from None
    if not args.json:
        _print(f"report  {html_path} (self-contained, opens offline)")
    return 0
