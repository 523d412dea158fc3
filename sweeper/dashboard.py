"""optuna-dashboard on a study, with what sweeper measured: each trial's trace (JSON), loss curve (SVG) and, after a
NaN, its failing batch as artifacts in Optuna's artifact store (``studies/<study>/artifacts``); on the study, the
Pareto-front figure and a markdown note per pruned or failed trial (optuna-dashboard's plotly-figure and note APIs).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.study import study_dir
from sweeper.trial import TrialResult

#: Id of the front figure among the study's plotly graph objects (optuna-dashboard requires ``[A-Za-z0-9_-]+``).
FRONT_FIGURE_ID = "pareto-front"


def artifact_dir(study_name: str) -> Path:
    """``studies/<study>/artifacts``: the study's ``FileSystemArtifactStore``."""
    return study_dir(study_name) / "artifacts"


def artifact_store(study_name: str) -> optuna.artifacts.FileSystemArtifactStore:
    """The study's artifact store (the folder is created)."""
    folder = artifact_dir(study_name)
    folder.mkdir(parents=True, exist_ok=True)
    return optuna.artifacts.FileSystemArtifactStore(str(folder))


def upload_trial_artifacts(trial: optuna.Trial | FrozenTrial, result: TrialResult, folder: Path,
                           store: optuna.artifacts.FileSystemArtifactStore) -> list[str]:
    """Write ``trace.json`` and ``loss_curve.svg`` into the trial's folder and upload them, with ``nan_batch.jsonl``
    when the trial left one, to ``store``.

    Returns:
        The artifact ids.
    """
    from sweeper.figures import loss_curve_svg

    folder.mkdir(parents=True, exist_ok=True)
    trace = {"loss": result.loss_trace, "grad_norm": result.grad_norm_trace,
             "max_activation": result.max_activation_trace, "skipped_steps": result.skipped_steps,
             "supervised_tokens": result.supervised_tokens_trace}
    (folder / "trace.json").write_text(json.dumps(trace))
    (folder / "loss_curve.svg").write_text(loss_curve_svg(result.loss_trace, result.grad_norm_trace,
                                                          f"trial {trial.number}, {result.status}"))
    files = [("trace.json", "application/json"), ("loss_curve.svg", "image/svg+xml")]
    if (folder / "nan_batch.jsonl").is_file():
        files.append(("nan_batch.jsonl", "application/json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return [optuna.artifacts.upload_artifact(artifact_store=store, file_path=str(folder / name),
                                                 study_or_trial=trial, mimetype=mime) for name, mime in files]


def failure_note(trial: FrozenTrial) -> str:
    """A short markdown note on a pruned or failed trial: status (with NaN cause), reason, step and what to look at.
    """
    a = trial.user_attrs
    status = a.get("status", trial.state.name.lower())
    cause = f" ({a['nan_cause']})" if a.get("nan_cause") else ""
    lines = [f"### Trial {trial.number}: {status}{cause}", "", a.get("reason", "")]
    if a.get("fail_step") is not None:
        lines += ["", f"Failed at step {a['fail_step']} ({a.get('fail_phase')}), "
                      f"peak memory {a.get('peak_memory_gib') or 0:.3f} GiB ({a.get('memory_kind')})."]
    if a.get("nan_samples"):
        lines += ["", f"Samples: {', '.join(map(str, a['nan_samples']))}; the failing batch is the "
                      "`nan_batch.jsonl` artifact."]
    return "\n".join(lines)


def publish_study(study: optuna.Study) -> None:
    """Put the Pareto-front figure on the study, and a note on every pruned or failed trial and every repeat that has
    none yet (a user's own notes are never overwritten)."""
    from optuna_dashboard import save_note, save_plotly_graph_object
    from optuna_dashboard._note import get_note_from_system_attrs

    from sweeper.figures import front_figure
    from sweeper.report import front_data

    save_plotly_graph_object(study, front_figure(front_data(study)), graph_object_id=FRONT_FIGURE_ID)
    system_attrs = study._storage.get_study_system_attrs(study._study_id)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        if get_note_from_system_attrs(system_attrs, t._trial_id)["body"]:
            continue
        if "duplicate_of" in t.user_attrs:
            body = (f"### Trial {t.number}: repeat of trial {t.user_attrs['duplicate_of']}\n\nThe sampler proposed a "
                    "configuration already measured; its result was reused and nothing ran (it does not count "
                    "toward n_trials).")
        elif t.state == TrialState.COMPLETE:
            continue
        else:
            body = failure_note(t)
        save_note(optuna.Trial(study, t._trial_id), body)


def serve(storage: str, study_name: str, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Run optuna-dashboard on ``storage`` with the study's artifact store until interrupted (blocks).

    Raises:
        StudyError: The address cannot be bound (port in use, unknown host); checked before the server starts.
    """
    import socket

    from optuna_dashboard import run_server

    from sweeper.errors import StudyError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except (OSError, OverflowError) as exc:
        raise StudyError(f"{host}:{port}: --host/--port: cannot listen there ({exc}); choose a free --port, or "
                         "--host 127.0.0.1") from None

    run_server(storage, host=host, port=port, artifact_store=artifact_store(study_name))


def dashboard_app(storage: str | Any, study_name: str) -> Any:
    """The same dashboard as a WSGI application (for tests and WSGI servers)."""
    from optuna_dashboard import wsgi

    return wsgi(storage, artifact_store=artifact_store(study_name))
