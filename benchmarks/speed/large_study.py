"""What a study of thousands of trials costs to read and report (issue 49's item 3): copies of a real study's
trials, N of them, in a fresh SQLite study; then one read of it as a command makes it (``sweeper.study.snapshot`` of
a freshly loaded study), the sweep loop's bookkeeping per trial (its one read under the ask lock, on a study object
whose finished trials Optuna caches, and the view updated with the trial it told), and ``sweep report`` (terminal,
``--json``, ``--html``) timed as a user runs them; medians of 3 for the reads.

    python benchmarks/speed/large_study.py STUDIES_DIR [STUDY] [--trials 2000] \\
        [--storage sqlite|journal] [--sweeper PATH]
        [--out FILE.json]

STUDIES_DIR is a ``studies/`` folder (the demo's after ``make demo``); it is read, never written. ``--sweeper PATH``
imports sweeper from another checkout (a ``git worktree`` of an older commit) to measure it the same way: before and
after. Prints one line a figure and writes them as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401


def _use(sweeper_path: str | None) -> None:
    if sweeper_path is None:
        return
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, str(Path(sweeper_path).resolve()))


def _storage(url: str):
    """Optuna's storage for ``url`` (a ``journal:///`` URL as sweeper opens it)."""
    if url.startswith("journal:///"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url.removeprefix("journal:///")))
    return url


def build(source_db: Path, name: str, target: str, n: int) -> None:
    """A study named ``name`` in the storage at URL ``target`` holding ``n`` copies of ``source_db``'s finished trials
    (cycled), with its study attributes (confirmations left out: they name the source's trial numbers)."""
    import optuna

    source = optuna.load_study(study_name=name, storage=f"sqlite:///{source_db}")
    finished = [t for t in source.get_trials(deepcopy=False) if t.state.is_finished()]
    target = optuna.create_study(
        study_name=name, storage=_storage(target), directions=source.directions, load_if_exists=False
    )
    for key, value in source.user_attrs.items():
        if not key.startswith("confirmation"):
            target.set_user_attr(key, value)
    batch = []
    for i in range(n):
        t = finished[i % len(finished)]
        batch.append(
            optuna.trial.create_trial(
                state=t.state,
                values=t.values,
                params=t.params,
                distributions=t.distributions,
                user_attrs=dict(t.user_attrs),
                system_attrs={k: v for k, v in t.system_attrs.items() if k.startswith("constraints")},
            )
        )
        if len(batch) == 200:
            target.add_trials(batch)
            batch = []
    target.add_trials(batch)


def timed(fn, repeat: int = 3) -> float:
    """The median wall time of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies")
    parser.add_argument("study", nargs="?", default="demo")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--sweeper", help="import sweeper from this checkout")
    parser.add_argument("--storage", choices=("sqlite", "journal"), default="sqlite")
    parser.add_argument("--out")
    args = parser.parse_args()
    _use(args.sweeper)
    import optuna

    import sweeper
    from sweeper.study import snapshot

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = Path(tempfile.mkdtemp())
    try:
        (work / "studies").mkdir()
        if args.storage == "journal":
            url = f"journal:///{work / 'studies' / args.study}.log"
        else:
            url = f"sqlite:///{work / 'studies' / args.study}.db"
        build(Path(args.studies) / f"{args.study}.db", args.study, url, args.trials)
        if (Path(args.studies) / args.study).is_dir():  # the study's folder: its identity file, artifacts
            shutil.copytree(Path(args.studies) / args.study, work / "studies" / args.study)
        figures: dict[str, float | int | str] = {
            "trials": args.trials,
            "storage": args.storage,
            "sweeper": str(Path(sweeper.__file__).parent),
        }
        # a command's one read: a fresh study object (Optuna's storage caches finished trials per object)
        figures["read_cold_s"] = timed(
            lambda: snapshot(optuna.load_study(study_name=args.study, storage=_storage(url)))
        )
        study = optuna.load_study(study_name=args.study, storage=_storage(url))
        snapshot(study)
        # the sweep loop's read a trial: the same study object, its finished trials cached after the first read
        figures["read_in_loop_s"] = timed(lambda: snapshot(study))
        view = snapshot(study)
        last = study.get_trials(deepcopy=False)[-1]
        with_trial = getattr(view, "with_trial", None)
        figures["view_update_s"] = timed(lambda: with_trial(last).finished) if with_trial else float("nan")
        env = {**os.environ, "PYTHONPATH": str(Path(args.sweeper).resolve())} if args.sweeper else None
        runner = [sys.executable, "-c", _RUNNER, args.sweeper or ""]
        for label, extra in (("report_s", []), ("report_json_s", ["--json"]), ("report_html_s", ["--html", "r.html"])):
            start = time.perf_counter()
            ref = args.study if args.storage == "sqlite" else url
            done = subprocess.run([*runner, "report", ref, *extra], cwd=work, env=env, capture_output=True)
            figures[label] = time.perf_counter() - start
            if done.returncode != 0:
                print(done.stderr.decode()[-2000:], file=sys.stderr)
                return 1
        for key, value in figures.items():
            print(f"{key:16} {value:.2f}" if isinstance(value, float) else f"{key:16} {value}")
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


#: ``sweep`` from the checkout given as the first argument (empty: the installed one).
_RUNNER = """
import sys
path = sys.argv.pop(1)
if path:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, path)
from sweeper.cli import main
sys.argv[0] = "sweep"
sys.exit(main())
"""

if __name__ == "__main__":
    sys.exit(main())
