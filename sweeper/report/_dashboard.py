"""optuna-dashboard on a study, with what sweeper measured: each trial's trace (JSON), loss curve (SVG) and, after a
NaN, its failing batch as artifacts in Optuna's artifact store (``studies/<study>/artifacts``); on the study, the
Pareto-front figure (peak memory against the stability margin) and a markdown note per trial: why a pruned or failed
one ended, a complete one's margin, a confirmed one's long run (optuna-dashboard's plotly-figure and note APIs). Its
own plots show the study's objectives, ``edge_proximity`` being ``1 / stability_margin``.
"""

from __future__ import annotations

import threading
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

import optuna
from optuna.trial import TrialState

from sweeper.notation import format_instability
from sweeper.report._trial_text import margin_line
from sweeper.storage import unnoted_trials
from sweeper.study import StoredTrial, artifact_store, snapshot

#: Id of the front figure among the study's plotly graph objects (optuna-dashboard requires ``[A-Za-z0-9_-]+``).
FRONT_FIGURE_ID = "pareto-front"


def failure_note(trial: StoredTrial) -> str:
    """A short markdown note on a pruned or failed trial: status (with NaN cause), reason, step and what to look at."""
    r = trial.result
    cause = f" ({r.nan.cause})" if r.nan.cause else ""
    lines = [f"### Trial {trial.number}: {trial.status_name}{cause}", "", r.reason]
    if r.fail_step is not None:
        lines += [
            "",
            f"Failed at step {r.fail_step} ({r.fail_phase}), "
            f"peak memory {r.memory.peak_memory_gib or 0:.3f} GiB ({r.memory.memory_kind}).",
        ]
    if r.nan.samples:
        lines += [
            "",
            f"Samples: {', '.join(map(str, r.nan.samples))}; the failing batch is the `nan_batch.jsonl` artifact.",
        ]
    return "\n".join(lines)


def confirmation_note(trial: StoredTrial) -> str:
    """A short markdown note on a confirmed trial: how its long run ended, against its short result."""
    done = trial.confirmation
    assert done is not None
    head = (
        f"### Trial {trial.number}: confirmed at {done.steps} steps"
        if done.passed
        else (f"### Trial {trial.number}: FAILED its {done.steps}-step confirmation ({done.status})")
    )
    short = trial.result.constant.instability
    lines = [head, "", done.reason]
    if done.predicted_to_hold is not None:
        lines += [
            "",
            f"Its short trial's predicted_max_lr {done.predicted_max_lr:.3g} said it would "
            f"{'hold' if done.predicted_to_hold else 'fail'}: "
            + ("as predicted." if done.margin_held else "**not** as predicted."),
        ]
    elif done.left_open:
        lines += [
            "",
            f"Its short trial's predicted_max_lr {done.predicted_max_lr:.3g} left it open: the learning rate lies "
            "inside the prediction's 95% interval, where either outcome is within the noise.",
        ]
    if done.instability is not None and short is not None:
        lines += [
            "",
            f"Instability over the long run {format_instability(done.instability)} (the short trial's: "
            f"{format_instability(short)}).",
        ]
    if not done.passed:
        lines += ["", "`sweep export` refuses this trial."]
    return "\n".join(lines)


def publish_study(study: optuna.Study) -> None:
    """Put the Pareto-front figure on the study, and a note on every pruned, failed or confirmed trial and every
    repeat that has none yet (a user's own notes are never overwritten)."""
    from optuna_dashboard import save_note, save_plotly_graph_object

    from sweeper.report._data import front_data
    from sweeper.report._figures import front_figure

    read = snapshot(study)  # read once: the figure and the notes
    save_plotly_graph_object(study, front_figure(front_data(read)), graph_object_id=FRONT_FIGURE_ID)
    for t, handle in unnoted_trials(study, read.trials_in((TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))):
        if t.is_repeat:
            body = (
                f"### Trial {t.number}: repeat of trial {t.repeat_of}\n\nThe sampler proposed a "
                "configuration already measured; its result was reused and nothing ran (it does not count "
                "toward n_trials)."
            )
        elif t.state == TrialState.COMPLETE and t.confirmation is not None:
            body = confirmation_note(t)
        elif t.state == TrialState.COMPLETE and t.result.stress.stop is not None:
            rate = t.config.learning_rate if t.config is not None else None
            body = f"### Trial {t.number}: complete\n\n{margin_line(t.result, rate)}."
        elif t.state == TrialState.COMPLETE:
            continue
        else:
            body = failure_note(t)
        save_note(handle, body)


def serve(storage: str, study_name: str, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Run optuna-dashboard on ``storage`` with the study's artifact store until interrupted (blocks).

    Raises:
        StudyError: The address cannot be bound (port in use, unknown host); checked before the server starts.
    """
    import socket

    from sweeper.errors import StudyError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except (OSError, OverflowError) as exc:
        raise StudyError(
            f"{host}:{port}: --host/--port: cannot listen there ({exc}); choose a free --port, or --host 127.0.0.1"
        ) from None

    # optuna-dashboard's run_server serves requests in this (the main) thread, where wsgiref's handler catches every
    # exception a request raises, KeyboardInterrupt included: a SIGTERM (the CLI raises it as Ctrl-C) that came during
    # a request was swallowed and the server went on. Requests are served in a thread of their own here, so that the
    # signal reaches this thread, which then shuts the server down.
    server = make_server(host, port, dashboard_app(storage, study_name), server_class=_Server)
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
    finally:
        # The server thread ends after the request it is answering; one stuck on a client that does not read (or on
        # a full output pipe) must not keep the process alive: wait for it a few seconds at most (it is a daemon).
        stopper = threading.Thread(target=server.shutdown, name="dashboard-shutdown", daemon=True)
        stopper.start()
        stopper.join(SHUTDOWN_WAIT_S)
        server.server_close()


#: Seconds ``sweep dashboard`` waits, after Ctrl-C or SIGTERM, for the request it is answering to end.
SHUTDOWN_WAIT_S = 5.0


class _Server(WSGIServer):
    """wsgiref's server, accepting the address families ``socket.getaddrinfo`` gives (IPv6 hosts included)."""

    def __init__(self, address: Any, handler: Any) -> None:
        import socket

        infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)
        self.address_family = infos[0][0]
        super().__init__(address, handler)


def dashboard_app(storage: str | Any, study_name: str) -> Any:
    """The same dashboard as a WSGI application (for tests and WSGI servers)."""
    from optuna_dashboard import wsgi

    return wsgi(storage, artifact_store=artifact_store(study_name))
