"""``sweep dashboard STUDY``: optuna-dashboard on the study, with its artifacts, the front figure and notes."""

from __future__ import annotations

import argparse

from sweeper.cli._common import _check_owner, _print, _publish
from sweeper.errors import SpaceError


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``sweep dashboard STUDY``: optuna-dashboard on the study, with its artifacts, the front figure and notes."""

    from sweeper.report import serve
    from sweeper.storage import dashboard_storage, redact_url
    from sweeper.study import load_existing_study

    if not 1 <= args.port <= 65535:
        raise SpaceError(f"--port: {args.port} is not a port; give 1-65535, e.g. --port 8080")
    study, url = load_existing_study(args.study)
    # its artifacts are read from studies/<name>/: from another folder every one was an HTTP 500 (and an empty folder
    # was made there), so it refuses as report, export and confirm do
    _check_owner(study, url, "the dashboard serves the trials' artifacts from the study's own folder")
    _publish(study)
    _print(f"dashboard http://{args.host}:{args.port}/dashboard/ on {redact_url(url)} (Ctrl-C to stop)")
    if not _loopback(args.host):
        _print(
            f"WARNING dashboard: listening on {args.host}: anyone who can reach this port can read the study and edit "
            "its notes (optuna-dashboard has no login); for a remote machine keep --host 127.0.0.1 and forward the "
            f"port (ssh -L {args.port}:127.0.0.1:{args.port} HOST)"
        )
    try:
        serve(dashboard_storage(url), study.study_name, host=args.host, port=args.port)
    except KeyboardInterrupt:
        return 0
    return 0


def _loopback(host: str) -> bool:
    """``host`` names this machine only (``localhost``, ``127.x.x.x``, ``::1``)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
