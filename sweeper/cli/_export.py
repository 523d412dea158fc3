"""``sweep export STUDY``: a trial of the study as a config for production training."""

from __future__ import annotations

import argparse
from typing import Any

from sweeper.cli._common import _check_owner, _print


def cmd_export(args: argparse.Namespace) -> int:
    """``sweep export STUDY``: the chosen trial as a production config."""

    from sweeper.export import EXPORT_FORMATS, export_path, write_export
    from sweeper.notation import format_headroom
    from sweeper.report import margin_text
    from sweeper.storage import study_dir
    from sweeper.study import load_existing_study, snapshot

    loaded, url = load_existing_study(args.study)
    if args.onto:
        return _onto(loaded, args)
    if not args.output:
        _check_owner(loaded, url, "to write the export elsewhere, give -o PATH")
    study = snapshot(loaded, horizon_steps=args.horizon)
    trial, how = _chosen(study, args)
    _refuse_unmatched_targets(study, trial)
    values = trial.values or (float("nan"), float("nan"))
    where = args.output or f"{study_dir(study.name) / 'exports'}/"
    target = export_path(where, args.format, f"trial{trial.number}-{args.format}")
    suffixes = {f.suffix for f in EXPORT_FORMATS}  # the hf export's .json beside its .py is the json format's
    existed = {target.with_suffix(suffix) for suffix in suffixes} if target.parent.is_dir() else set()
    existed = {p for p in existed if p.exists()}
    warnings: list[str] = []
    files = write_export(study, trial, args.format, target, force=args.force, warnings=warnings)
    replaced = [f for f in files if f in existed]
    room = "" if "(headroom " in how else f", headroom {format_headroom(trial.headroom)}"  # said once on the line
    _print(
        f"export  {how} (peak {values[0]:.3f} GiB, margin {margin_text(trial.result.stress)}{room}) as {args.format}: "
        + ", ".join(str(f) for f in files)
        + (f" (replaced {len(replaced)} earlier file{'s' if len(replaced) > 1 else ''})" if replaced else "")
    )
    for line in warnings:
        _print(f"WARNING export: {line}")
    return 0


def _onto(loaded: Any, args: argparse.Namespace) -> int:
    """``sweep export STUDY --onto FILE``: the chosen trial's measured keys written onto the user's own config, the
    diff and what changed printed; the chance of diverging for the file's own ``max_steps`` (``--horizon`` over it)."""
    from sweeper.errors import StudyError
    from sweeper.export import write_onto
    from sweeper.export.production import ProductionConfigError, read_production
    from sweeper.study import snapshot

    try:  # the trial must be one the file's own tool can express (a packed trial onto axolotl, not hf)
        reading = read_production(args.onto)
    except ProductionConfigError as exc:
        raise StudyError(f"--onto: {exc}") from None
    tool = reading.tool
    steps = next(
        (k.value for k in reading.lines if k.key == "max_steps" and type(k.value) is int and k.value > 0), None
    )
    horizon = args.horizon or steps
    study = snapshot(loaded, horizon_steps=horizon)
    args.format = {"axolotl": "axolotl", "llama-factory": "llama-factory", "trl": "trl"}.get(tool, "json")
    trial, how = _chosen(study, args)
    _refuse_unmatched_targets(study, trial)
    done = write_onto(study, trial, args.onto, args.output, force=args.force)
    _print(done.diff.rstrip("\n") if done.diff else f"{args.onto}: already as measured")
    changed = ", ".join(f"{k} {before!r} -> {after!r}" for k, (before, after) in done.changed.items())
    _print(
        f"export  {how} onto {args.onto}: {done.path}"
        + (f" (the original kept as {done.backup})" if done.backup else "")
        + (f"; changed {changed}" if changed else "; no key changed")
        + (
            f"; the chance of diverging is for its max_steps, {steps} steps"
            if steps is not None and horizon == steps
            else ""
        )
    )
    return 0


def _chosen(study: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The trial ``sweep export`` writes, and how it was chosen, for its line: ``--trial N`` (a repeat's measured
    trial), else ``--pick`` among the trials ``--format`` can express (and the study's own pick when that differs).

    Raises:
        StudyError: No such trial, or none the format can express (the picks' refusal).
    """
    from sweeper.export import choose_for_format, inexpressible, pick_trial

    if args.trial is not None:
        trial = pick_trial(study, number=args.trial, fmt=args.format)
        if trial.number != args.trial:
            return trial, f"trial {args.trial}, a repeat of trial {trial.number} (its measured result)"
        return trial, f"trial {trial.number}"
    choice = choose_for_format(study, args.pick, args.format)
    trial, how = choice.chosen(), choice.line
    # every trial of the front failed its confirmation: the format's pick stands alone
    overall = choose_for_format(study, args.pick).trial or trial
    if overall.number != trial.number:  # picked on the front of the trials the format can express
        reason = inexpressible(overall, args.format)
        how += f"; the study's {args.pick} is trial {overall.number}" + (f": {reason}" if reason else "")
    return trial, how


def _refuse_unmatched_targets(study: Any, trial: Any) -> None:
    """A trial whose ``target_modules`` name a module the model does not have (a study from before sweep run checked
    them) trained LoRA on the others only: the production config would name a module that takes no effect.

    Raises:
        StudyError: One line naming the targets, the model's modules and the fix.
    """
    from sweeper.checkpoint import module_names, short_names, unmatched_targets
    from sweeper.errors import StudyError

    model_path = study.model_path
    if trial.config is None or not model_path:
        return
    modules = module_names(model_path)
    missing = unmatched_targets(trial.config.target_modules, modules) if modules is not None else []
    if missing:
        raise StudyError(
            f"{study.name}: trial {trial.number}: target_modules {missing} match no module of "
            f"{model_path}, so its LoRA trained without them; not exported: fix training.target_modules "
            f"(the model's modules: {', '.join(short_names(modules or []))}) and run the study again"
        )
