"""``sweep run SPACE.yaml``: create or resume the study and run trials until ``n_trials`` or the timeout."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from sweeper.cli._common import (
    _audit,
    _describe_setup,
    _devices,
    _dropped_rows_line,
    _load,
    _prepare,
    _print,
    _publish,
)
from sweeper.errors import SpaceError
from sweeper.space import SearchSpace, parse_duration_s


def _data_warnings(space: SearchSpace, model_path: str, samples: list) -> list[str]:
    """Before the first trial: the data audit at the searched ``max_seq_length`` values, as warning lines
    (:func:`sweeper.report.format_data_warnings`), so that a data fault is never read as a hyperparameter result."""
    from sweeper.audit import nan_risks
    from sweeper.report import format_data_warnings

    report, tokenized = _audit(samples, space.model, model_path, space.values_of("max_seq_length"))
    accumulation = space.values_of("gradient_accumulation_steps")
    risks = nan_risks(
        report,
        tokenized,
        space.values_of("per_device_train_batch_size"),
        accumulation,
        max(space.values_of("max_steps")),
    )
    return format_data_warnings(
        report, risks, several_accumulations=len(accumulation) > 1, doctor=f"sweep doctor {space.path}"
    )


def _nothing_fits(space: SearchSpace, model_path: str, study: Any) -> str | None:
    """One line when no configuration of the space is predicted to fit its cap, by the memory model corrected with
    what the study measured on this kind of machine (:func:`sweeper.study.nothing_fits`); None when something does,
    or the study already holds a trial that fit under a cap no larger than this run's (a fit under a larger cap, before
    a resume with a smaller ``memory_limit_gib``, says nothing about this one)."""
    from sweeper.study import device_kind, known_memory, memory_predictor, nothing_fits, stored_calibration

    kind = device_kind()
    raw = memory_predictor(model_path, space.model.name_or_path, space.model.attn_implementation)
    calibration = stored_calibration(study, kind)

    def predict(config: Mapping[str, Any]) -> float | None:
        peak = raw(config)
        return calibration.correct(config, peak) if calibration is not None and peak is not None else peak

    limit_gib = float(space.fixed["memory_limit_gib"])
    fit = any(
        k.fits and float(k.config.get("memory_limit_gib", math.inf)) <= limit_gib for k in known_memory(study, kind)
    )
    return nothing_fits(space, predict, known_fit=fit)


def _other_caps(study: Any, limit_gib: float) -> str | None:
    """``3 trials were measured under memory_limit_gib 1.7`` for the measured trials of a resumed study whose cap was
    not this run's, or None."""
    from collections import Counter

    from sweeper.study import stored_trials

    caps: Counter[float] = Counter()
    for t in stored_trials(study):
        cap = t.config.memory_limit_gib if t.config is not None and not t.is_repeat else None
        if cap is not None and float(cap) != limit_gib:
            caps[float(cap)] += 1
    if not caps:
        return None
    n = sum(caps.values())
    shown = ", ".join(f"{c:g}" for c in sorted(caps))
    return f"{n} trial{'s were' if n != 1 else ' was'} measured under memory_limit_gib {shown}"


def _memory_line(study: Any) -> str | None:
    """How far the preflight's predictions were from the measured peaks, before and after the study's correction
    (:func:`sweeper.study.prediction_errors`), and the correction now stored; None without a measured peak."""
    from sweeper.study import device_kind, median_abs, prediction_errors, stored_calibration

    rows = prediction_errors(study)
    raw = median_abs(r["error"] for r in rows)
    if raw is None:
        return None
    line = f"memory  predicted vs measured peak: median error {100 * raw:.0f}% (memory model)"
    corrected = [r["corrected_error"] for r in rows if r["corrected_error"] is not None]
    if corrected:
        error = median_abs(corrected)
        plural = "s" if len(corrected) != 1 else ""
        line += f", {100 * error:.0f}% corrected ({len(corrected)} trial{plural} predicted with the correction)"  # type: ignore[operator]
    calibration = stored_calibration(study, device_kind())
    if calibration is not None:
        shown = [
            f"{g} {calibration.lines[g][0]:+.2f} + {calibration.lines[g][1]:.2f} x predicted"
            if g in calibration.lines
            else f"{g} x{r:.2f}"
            for g, r in sorted(calibration.ratios.items())
        ]
        line += "; correction now " + ", ".join(shown)
    return line


def cmd_run(args: argparse.Namespace) -> int:
    """``sweep run SPACE.yaml``: create or resume the study and run trials until n_trials or the timeout."""
    import optuna

    from sweeper.cli._confirm import run_confirmations
    from sweeper.report import format_counts, format_data_nan_summary, format_front, format_params, format_trial_line
    from sweeper.study import (
        MAX_CONSECUTIVE_DUPLICATES,
        SweepEvent,
        candidates,
        check_setup,
        check_writable,
        count_finished,
        default_storage,
        heartbeat_interval_s,
        in_memory,
        legacy_instability_warning,
        nan_causes,
        open_study,
        pareto_front,
        redact_url,
        run_study,
        slot_devices,
        status_counts,
        stored_trial,
        stored_trials,
        study_dir,
        trial_dir,
    )
    from sweeper.trial import FAIL_STATUSES, cuda_visible

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = _load(args)
    if not space.search:
        raise SpaceError(
            f"{args.space}: search: nothing to search (every key is fixed); give at least one key a "
            "list or a range, or use 'sweep trial' for one configuration"
        )
    timeout_s = parse_duration_s(args.timeout) if args.timeout is not None else None
    name = args.study or space.study.name
    storage = args.storage or space.study.storage or default_storage(name)
    n_trials = args.n_trials or space.study.n_trials
    devices = _devices(args.devices) if args.devices else None
    workers = args.workers or (len(devices) if devices else 1)
    heartbeat_interval_s()  # a bad SWEEPER_HEARTBEAT_INTERVAL_S is one line before anything runs
    if workers > 1 and in_memory(storage):
        raise SpaceError(
            f"--storage: {redact_url(storage)} is an in-memory database, one per connection, which "
            f"--workers {workers} cannot share; give a file, e.g. --storage sqlite:///studies/{name}.db"
        )
    model_path, samples = _prepare(space.dataset, space.model)
    setup = check_setup(space, model_path)  # what would fail every trial the same way: once, here
    if setup:
        raise SpaceError(setup)
    check_writable(study_dir(name))  # before the storage is touched
    study = open_study(space, storage, name, n_trials)  # a storage problem is one line before any output
    unfit = _nothing_fits(space, model_path, study)
    if unfit:
        raise SpaceError(unfit)
    already = count_finished(study)
    _print(f"sweep: study '{name}' in {redact_url(storage)}, {n_trials} trials, searching {', '.join(space.search)}")
    if workers > 1 or devices:
        slots = slot_devices(workers, devices)
        if any(d is not None for d in slots):
            shown = ", ".join(f"device {d}" if d is not None else "this machine" for d in slots)
        else:
            threads = max(1, (os.cpu_count() or 1) // workers)
            shown = f"on the CPU, {threads} thread{'s' if threads > 1 else ''} each"
        _print(f"workers {workers} trial{'s' if workers > 1 else ''} at once ({shown})")
        if devices and not cuda_visible():
            _print("note    --devices names GPUs, but none is visible here: the trials run on the CPU")
    _print(_describe_setup(space, model_path, len(samples)))
    dropped = _dropped_rows_line(space, model_path, samples)
    if dropped:
        _print(dropped)
    for line in _data_warnings(space, model_path, samples):
        _print(line)
    if 0 < already < n_trials:
        _print(f"resume  the study holds {already} finished trials; {n_trials - already} to go")
        other_caps = _other_caps(study, float(space.fixed["memory_limit_gib"]))
        if other_caps:
            _print(
                f"note    memory_limit_gib is {space.fixed['memory_limit_gib']:g} now; {other_caps}: their peaks "
                "stand, but what fit under their cap, and the front they are on, need not hold under this one"
            )
    legacy = legacy_instability_warning(study)
    if legacy:
        _print(legacy)
    start = time.monotonic()
    statuses: list[str] = []  # of the trials this run measured

    def on_start(number: int, params: dict, device: str | None) -> None:
        if workers > 1:
            shown = format_params({k: params.get(k) for k in space.search})
            _print(f"start   #{number:<3} {shown}" + (f"  [device {device}]" if device is not None else ""))

    def on_trial(event: SweepEvent) -> None:
        trial = stored_trial(event.trial)
        params = {k: trial.params.get(k) for k in space.search}
        line = format_trial_line(trial.number, params, event.result, event.finished, event.n_trials)
        if not trial.is_repeat:
            statuses.append(event.result.status)
        device = trial.user_attrs.get("cuda_visible_devices")
        if workers > 1 and device is not None:
            line += f"  [device {device}]"
        if trial.retry_of is not None:
            line += f"  (retry {trial.retry_attempt or 1} of #{trial.retry_of})"
        if trial.retried:
            line += "  (its configuration runs again: max_retries)"
        _print(line)

    if already >= n_trials:
        _print(
            f"the study already holds {already} finished trials (n_trials={n_trials}): nothing to run; "
            "raise --n-trials to measure more"
        )
    run_study(
        space,
        model_path=model_path,
        storage=storage,
        study_name=name,
        n_trials=n_trials,
        timeout_s=timeout_s,
        on_trial=on_trial,
        on_note=lambda text: _print(f"note    {text}"),
        on_start=on_start,
        study=study,
        workers=workers,
        devices=devices,
    )
    if space.study.confirm_steps is not None:
        study.set_user_attr("confirm_steps", space.study.confirm_steps)  # the default of a later 'sweep confirm'
    top = [t.number for t in candidates(study)[: space.study.confirm_top]]
    if top:
        _print(f"confirm the front's {len(top)} best (study.confirm_top={space.study.confirm_top}):")
        run_confirmations(study, top, space.study.confirm_steps)
    front = pareto_front(study)
    finished = count_finished(study)
    if finished < n_trials and (timeout_s is None or time.monotonic() - start < timeout_s):
        _print(
            f"stopped at {finished} of {n_trials} trials: the sampler proposed only configurations already "
            f"measured {MAX_CONSECUTIVE_DUPLICATES} times in a row; widen the search to measure more"
        )
    _print()
    measured = sum(1 for t in stored_trials(study) if not t.is_repeat)
    _print(f"Pareto front (peak memory vs instability), {len(front)} of {measured} trials:")
    _print(format_front(front) if front else "  (no complete trial yet)")
    _print()
    _publish(study)
    causes = nan_causes(study)
    _print("trials: " + format_counts(status_counts(study), causes))
    memory = _memory_line(study)
    if memory:
        _print(memory)
    if "data" in causes:
        blamed = {t.number: t.result.nan_samples for t in stored_trials(study) if t.number in causes["data"]}
        trials_dir = trial_dir(name, 0).parent.as_posix()
        _print(format_data_nan_summary(causes, blamed, trials_dir) + f"; see 'sweep doctor {space.path}'")
    ref = name if storage == default_storage(name) else f"'{redact_url(storage)}'"
    # Export only what can be exported: with no complete trial the next step is finding out why.
    after = (
        f"sweep report {ref}, sweep dashboard {ref}, sweep export {ref} --pick knee"
        if front
        else f"sweep report {ref} (nothing to export: no trial completed; each trial's cause is there), "
        f"sweep doctor {space.path}"
    )
    _print(
        f"done in {time.monotonic() - start:.0f} s; study in {redact_url(storage)}; next: {after}"
        + (" (with your password in place of ***)" if "***" in ref else "")
    )
    if statuses and all(s in FAIL_STATUSES for s in statuses):
        print(
            f"sweep: every trial this run started failed ({', '.join(sorted(set(statuses)))}): the machine or the "
            f"setup, not the hyperparameters; see the reasons above and {trial_dir(name, 0).parent}/N/worker.log",
            file=sys.stderr,
        )
        return 1
    return 0
