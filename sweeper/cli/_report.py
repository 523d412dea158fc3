"""``sweep report STUDY``: the front, counts by status and NaN cause, the fit frontier; ``--json``; the
HTML report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sweeper.cli._common import _check_owner, _print, _study_ref
from sweeper.errors import SpaceError, SweeperError


def cmd_report(args: argparse.Namespace) -> int:
    """``sweep report STUDY``: the front, counts by status and NaN cause, the fit frontier; ``--json``; the HTML."""

    from sweeper.report import report_data, report_lines, report_written_line, write_html_report
    from sweeper.storage import study_dir
    from sweeper.study import load_existing_study, snapshot

    loaded, url = load_existing_study(args.study)
    if not args.html and not args.json:
        _check_owner(loaded, url, "to write the report elsewhere, give --html PATH")
    study = snapshot(loaded, horizon_steps=args.horizon)  # read once: every part of the report reads this snapshot
    html_path = Path(args.html) if args.html else study_dir(study.name) / "report.html"
    if html_path.suffix.lower() not in (".html", ".htm") or html_path.is_dir():
        raise SpaceError(f"{args.html}: --html: the report is an HTML file; give a path ending in .html")
    if args.json:
        _print(json.dumps(report_data(study).to_dict(), indent=2))
    else:
        for line in report_lines(study, _study_ref(args.study)):
            _print(line)
    if args.json and not args.html:
        return 0  # JSON for a script: no file unless --html asks for one
    try:
        write_html_report(study, html_path)
    except OSError as exc:
        raise SweeperError(
            [f"{html_path}: --html: cannot write the report ({exc.strerror}); choose a writable path"]
        ) from None
    if not args.json:
        _print(report_written_line(html_path))
    return 0
