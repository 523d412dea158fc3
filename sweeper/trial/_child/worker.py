"""The child side of a trial: the trial process's entry point and job loop.

``python -m sweeper.trial._child.worker --serve`` is a trial process that serves trials one after another (a *warm*
process, as Ray Tune's ``reuse_actors``): it imports torch, transformers, peft and bitsandbytes once, reads jobs as
JSON lines on stdin (:class:`~sweeper.trial._job.TrialJob`: ``config_path``, ``result_path``, ``log_path``,
``trial_dir``), sends :class:`~sweeper.trial._job.TrialProgress` lines on the control pipe (``SWEEPER_CONTROL_FD``)
while a trial runs, and after each writes the :class:`~sweeper.trial._result.TrialResult` as JSON and a
:class:`~sweeper.trial._job.TrialDone` line on the control pipe saying whether it can take another trial. Per trial
(:func:`run`) it caps its own memory and runs the recipe (:mod:`sweeper.trial._child.recipe`, on a
:class:`~sweeper.trial._child.context.TrialContext`: load the model in 4 bits or keep the one of the previous trial,
:mod:`~sweeper.trial._child.warm`; check it, :mod:`~sweeper.trial._child.checks`; attach LoRA; train ``max_steps``
steps recording each step; restore the base model), then maps how it ended to a status
(:mod:`sweeper.trial._child.outcome`) and fills the result from the record and the
:class:`~sweeper.trial._child.measurements.Measurements`. After anything but a ``complete`` or ``diverged`` trial it
exits: the next trial runs in a fresh process.

``python -m sweeper.trial._child.worker CONFIG.json RESULT.json`` runs one trial and exits (for debugging); its
trial folder is the config's.

The trial process imports this package's modules directly (``sweeper.trial._result``, never ``sweeper.trial``'s
public face), so the sweep's side (``sweeper.trial._launch``) is never loaded in it. With ``SWEEPER_DEBUG_MODULES``
set, each trial's ``worker.log`` ends with a line ``sweeper: modules loaded: [...]`` listing the ``sweeper`` modules
the process has imported.
"""

from __future__ import annotations

if __name__ == "__main__":  # first thing, before the heavy imports below (seconds): die with the sweep
    import faulthandler

    from sweeper.trial._child._process import die_with_parent

    die_with_parent()
    faulthandler.enable()  # as main() does: a fault in an import is named too

import faulthandler
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

from sweeper.devices import cuda_visible
from sweeper.space import TrialConfig
from sweeper.trial._child.checks import SetupCheckError
from sweeper.trial._child.context import TrialContext
from sweeper.trial._child.load import LOAD_REPORT, versions
from sweeper.trial._child.measurements import Measurements, copy_onto
from sweeper.trial._child.memory import (
    lift_cpu_memory_cap,
    peak_memory_gib,
    process_memory_gib,
    reset_cpu_peak,
)
from sweeper.trial._child.outcome import outcome_of
from sweeper.trial._child.progress import ProgressSender
from sweeper.trial._child.record import DivergedError, NonFiniteError, TrainingRecord, finite_or_none
from sweeper.trial._child.warm import WarmState, release_memory
from sweeper.trial._job import DEFAULT_MEASURES, Measures, TrialDone, TrialJob
from sweeper.trial._result import CUDA_ALLOC_CONF_NOT_APPLICABLE, Provenance, TrialResult
from sweeper.trial._status import TrialStatus

#: Kept allocated while the trial runs and released after an OOM, so the result can still be written under the cap.
_RESERVE_BYTES = 32 * 2**20

#: Set (to anything) in the trial process's environment, each trial's log ends with the sweeper modules it imported.
DEBUG_MODULES_ENV = "SWEEPER_DEBUG_MODULES"


def import_heavy() -> float:
    """Import torch, transformers, peft and bitsandbytes, and the recipe built on them; seconds it took (about 0
    when already imported)."""
    start = time.monotonic()
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers
    from transformers import Trainer  # noqa: F401

    import sweeper.trial._child.recipe  # noqa: F401  # its trainer subclasses transformers' at import

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return time.monotonic() - start


def _reset_peaks() -> None:
    """Start this trial's peak statistics from what the process holds now (CUDA and the CPU high-water mark)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    reset_cpu_peak()


def _begin(config: TrialConfig, warm: WarmState) -> bytearray:
    """Prepare the process for a trial: free what the last one left, log what the process holds, note the data
    segment's baseline, cap the memory on the CPU (:meth:`WarmState.set_cpu_cap`) and reset the peaks. Returns the
    memory reserve (:data:`_RESERVE_BYTES`), resident before the cap is computed."""
    release_memory()
    LOAD_REPORT.messages.clear()
    held = process_memory_gib()
    print(
        f"sweeper: trial {warm.trials + 1} of this process; it holds "
        + ", ".join(f"{k} {v:.3f} GiB" for k, v in held.items()),
        file=sys.stderr,
        flush=True,
    )
    if warm.base_gap_gib is None and "VmData" in held and "VmRSS" in held:
        warm.base_gap_gib = held["VmData"] - held["VmRSS"]
    reserve = bytearray(_RESERVE_BYTES)  # resident: it does not change the allowance below
    if not cuda_visible():
        allowance = warm.set_cpu_cap(config.memory_limit_gib)
        if allowance:
            print(f"sweeper: cap raised by {allowance:.3f} GiB freed by earlier trials", file=sys.stderr, flush=True)
    _reset_peaks()
    return reserve


def _train(trial: TrialContext) -> None:
    """The heavy imports (timed into ``trial.measured.import_time_s``), then the recipe's setup and train."""
    trial.measured.import_time_s = import_heavy()
    from sweeper.trial._child import recipe

    recipe.train(recipe.setup(trial), trial)


def _end(result: TrialResult, warm: WarmState, trial: TrialContext) -> None:
    """Lift the CPU cap, count the trial, decide whether the process stays warm (dropping the kept model when it
    does not); then each instrument writes its part of the result (:meth:`~sweeper.trial._child.instruments.
    Instrument.write`), after the step traces and the measurements (:func:`_fill`), and the device and versions.
    Before training began (loading failed), the peak since the trial began is the trial's."""
    if not cuda_visible():
        lift_cpu_memory_cap()
    warm.cap_gib = None
    warm.trials += 1
    warm.reusable = result.status in (TrialStatus.COMPLETE, TrialStatus.DIVERGED) and warm.model is not None
    if not warm.reusable:
        warm.drop_model()
    gc.collect()
    torch = sys.modules.get("torch")
    device_type = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    for instrument in trial.instruments:
        instrument.write(result, trial.config)
    if result.memory.peak_memory_gib is None:
        result.memory.peak_memory_gib = peak_memory_gib(device_type)
    result.memory.memory_kind = "cuda_max_reserved" if device_type == "cuda" else "cpu_peak_rss"
    result.provenance.device = device_type
    result.provenance.cuda_alloc_conf = (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if device_type == "cuda" else CUDA_ALLOC_CONF_NOT_APPLICABLE
    )
    if torch is not None:
        result.provenance.versions = versions()


def _fill(result: TrialResult, trial: TrialContext, t_setup: float) -> None:
    """The step traces from the record (for a NaN, with the failing step's values), the measurements, and what is
    derived from them (setup time, tokens per second); the instruments' undone seconds are taken out of the
    training time (:attr:`~sweeper.trial._child.instruments.Instrument.undone`)."""
    record, measured = trial.record, trial.measured
    constant = result.constant
    constant.steps_done = record.step
    constant.loss_trace, constant.grad_norm_trace = record.loss, record.grad_norm
    constant.max_activation_trace, constant.skipped_steps = record.max_activation, record.skipped
    if result.status is TrialStatus.NAN:  # the failing step's values, for the curves
        constant.loss_trace = record.loss + [finite_or_none(record.step_loss)]
        constant.grad_norm_trace = record.grad_norm + [finite_or_none(record.step_grad_norm)]
    if measured.train_time_s is not None:  # the worst-case step and the line searches are undone: their time is not
        measured.train_time_s -= sum(i.time_s for i in trial.instruments if i.undone)  # the training's
    copy_onto(result, measured)
    if measured.load_time_s is not None and measured.train_start is not None:
        result.provenance.setup_time_s = measured.train_start - t_setup
    if measured.train_time_s:
        constant.tokens_per_s = record.tokens / measured.train_time_s
    if record.processed_tokens:
        constant.data_token_share = record.tokens / record.processed_tokens


def run(
    config: TrialConfig,
    model_path: str,
    trial_dir: Path,
    warm: WarmState | None = None,
    progress: ProgressSender | None = None,
    *,
    measures: Measures = DEFAULT_MEASURES,
) -> TrialResult:
    """Run one trial in this process and return its result; never raises for a trial's own failure.

    Args:
        config: The trial.
        model_path: A local checkpoint (:func:`sweeper.model.resolve_model`).
        trial_dir: The trial's folder: the trainer's output and ``nan_batch.jsonl`` go there.
        warm: What this process kept from earlier trials (:class:`~sweeper.trial._child.warm.WarmState`); updated
            in place, and its ``reusable`` says whether the process may take another trial: only after ``complete``
            or ``diverged`` (an OOM, error or NaN leaves the process as a fresh one would not be: the NaN diagnosis
            replays rows outside training mode, which on some CPUs repacks the 4-bit weights).
        progress: Where the trial's progress lines go (None: nowhere).
        measures: The stress phase, probe and worst-case step to run (:class:`~sweeper.trial._job.Measures`).
    """
    warm = warm if warm is not None else WarmState()
    progress = progress if progress is not None else ProgressSender(None)
    progress.set_device("cuda" if cuda_visible() else "cpu")
    progress.peaks = None  # the last trial's phases are not this one's (its recipe sets them)
    t_setup = time.monotonic()
    reserve: bytearray | None = _begin(config, warm)
    progress.report("load")  # after _begin reset the peaks: the last trial's is not this one's
    record = TrainingRecord()
    measured = Measurements(warm=warm.trials > 0, model_reused=False)
    trial = TrialContext(
        config,
        model_path,
        trial_dir,
        record,
        measured,
        warm,
        progress,
        measures=measures,
    )
    try:
        _train(trial)
        outcome = outcome_of(None, record, config)
    except (NonFiniteError, DivergedError, SetupCheckError) as exc:
        outcome = outcome_of(exc, record, config)
    except BaseException as exc:
        reserve = None  # after an OOM, room to build and write the result under the cap
        gc.collect()
        outcome = outcome_of(exc, record, config, load_oom=LOAD_REPORT.mentions_oom(), cpu_capped=not cuda_visible())
        if outcome.status is TrialStatus.ERROR:
            traceback.print_exc()
    del reserve
    result = TrialResult(
        status=outcome.status,
        provenance=Provenance(lora_alpha=config.lora_alpha, effective_batch_size=config.effective_batch_size),
    )
    copy_onto(result, outcome)
    _fill(result, trial, t_setup)
    _end(result, warm, trial)
    return result


def _write_result(result: TrialResult, result_path: Path) -> None:
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), allow_nan=False))
    os.replace(tmp, result_path)


def _log_to(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so native libraries too) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _report_modules() -> None:
    """With :data:`DEBUG_MODULES_ENV` set, log the ``sweeper`` modules this process has imported (one line)."""
    if os.environ.get(DEBUG_MODULES_ENV):
        loaded = sorted(m for m in sys.modules if m == "sweeper" or m.startswith("sweeper."))
        print(f"sweeper: modules loaded: {json.dumps(loaded)}", file=sys.stderr, flush=True)


def _run_file(
    config_path: Path,
    trial_dir: Path,
    warm: WarmState | None = None,
    progress: ProgressSender | None = None,
    job: TrialJob | None = None,
) -> TrialResult:
    """:func:`run` on a ``config.json`` as the launcher writes it (``config`` and ``model_path``), with ``job``'s
    stress and probe settings (None: the defaults)."""
    payload = json.loads(config_path.read_text())
    config, model_path = TrialConfig.from_dict(payload["config"]), payload["model_path"]
    if job is None:
        return run(config, model_path, trial_dir, warm, progress)
    return run(config, model_path, trial_dir, warm, progress, measures=job.measures)


def serve(control_fd: int) -> None:
    """Serve trials read as JSON lines on stdin (:class:`~sweeper.trial._job.TrialJob`, each with its own stress and
    probe settings) until stdin closes or a trial leaves the process unfit for another (:attr:`WarmState.reusable`);
    while each runs, send its :class:`~sweeper.trial._job.TrialProgress` lines on ``control_fd``, and after it write
    its result file, then its :class:`~sweeper.trial._job.TrialDone` line. The heavy imports happen once, before the
    first job is read; the first trial's ``import_time_s`` and ``setup_time_s`` include them."""
    warm = WarmState()
    progress = ProgressSender(control_fd)
    process_import_s = import_heavy()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = TrialJob.from_line(line)
        _log_to(job.log_path)
        result = _run_file(Path(job.config_path), Path(job.trial_dir), warm, progress, job)
        if warm.trials == 1:
            result.provenance.import_time_s = process_import_s
            if result.provenance.setup_time_s is not None:
                result.provenance.setup_time_s += process_import_s
        _write_result(result, Path(job.result_path))
        _report_modules()
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(control_fd, TrialDone(reusable=warm.reusable).to_line())
        if not warm.reusable:
            break


def main(argv: list[str]) -> int:
    """``python -m sweeper.trial._child.worker --serve`` (:func:`serve`, control pipe in ``SWEEPER_CONTROL_FD``) or
    ``... CONFIG.json RESULT.json`` (one trial, in the config's folder); writes results atomically, exit 0 unless it
    could not."""
    # pyarrow (imported by datasets and the Trainer) reserves 1 GiB of virtual memory for mimalloc at import; under
    # RLIMIT_DATA that reservation would count as used. The system allocator reserves nothing (measured: VmData
    # 1.43 -> 0.46 GiB after importing transformers' Trainer).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # A process that dies of a signal (SIGSEGV: an allocation that failed under the CPU cap where a library does not
    # check it, a fault in a CUDA kernel or a C extension) writes its Python traceback to the log (file descriptor 2),
    # where the sweep reads where it was (sweeper.trial._ended.fault_frames). No cost until a signal arrives.
    faulthandler.enable()
    if argv[:1] == ["--serve"]:
        serve(int(os.environ["SWEEPER_CONTROL_FD"]))
    else:
        config_path, result_path = Path(argv[0]), Path(argv[1])
        _write_result(_run_file(config_path, config_path.parent), result_path)
        _report_modules()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: it can take seconds after a large model and changes nothing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
