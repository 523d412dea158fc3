"""Text for the terminal: a line per finished trial, what ``sweep trial`` prints of one trial (its trace and
measurements), the Pareto front table, status counts, the data audit, the study's notes (a 0.1.0 instability, trials
of other setups).

Pure formatting: every function returns a string (or its lines); the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeper.audit import AuditReport, NanRisk
from sweeper.report._records import MemoryPrediction, phase_peaks_text
from sweeper.space import TrialConfig
from sweeper.stability import (
    StabilityFigures,
    barely_learns,
    format_headroom,
    format_instability,
    format_margin_range,
    format_rate_range,
    headroom_of,
)
from sweeper.study import Objective, StoredTrial, StudyLike, snapshot
from sweeper.trial import StressOutcome, TrialResult, TrialStatus

#: Short column names of per-trial keys in the console (the full names are in the study and the reports).
SHORT_NAMES = {
    "r": "r",
    "lora_alpha_ratio": "alpha/r",
    "bnb_4bit_compute_dtype": "compute",
    "bnb_4bit_use_double_quant": "dq",
    "bnb_4bit_quant_type": "quant",
    "per_device_train_batch_size": "batch",
    "max_seq_length": "seq",
    "learning_rate": "lr",
    "gradient_accumulation_steps": "ga",
}


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e6 else f"{value:.3g}"
    return str(value)


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def format_params(params: Mapping[str, Any]) -> str:
    """``r=16 alpha/r=2 compute=bfloat16 ...`` in the given order."""
    return " ".join(f"{SHORT_NAMES.get(k, k)}={_fmt(v)}" for k, v in params.items())


def status_label(status: str, nan_cause: str | None) -> str:
    """``nan/data``, ``nan/precision``, ``nan/optimization`` for diagnosed NaN trials, else the status."""
    return f"{status}/{nan_cause}" if status == "nan" and nan_cause else status


#: Width of the status column: the longest status a trial line shows (``nan/optimization``, ``predicted_oom``,
#: ``dominated_oom``), so that the columns after it stay aligned whatever the status.
STATUS_WIDTH = max(
    *(len(s.value) for s in TrialStatus),
    *(len(status_label("nan", cause)) for cause in ("data", "precision", "optimization", "unknown")),
)


def format_trial_line(number: int, params: Mapping[str, Any], result: TrialResult, finished: int, n_trials: int) -> str:
    """One line per finished trial: progress, number, searched values, status (with the NaN cause), peak GiB,
    stability margin, instability, seconds, whether its trial process was ``cold`` (a fresh process), ``warm``
    (imports paid by an earlier trial) or ``warm, model kept`` (the 4-bit model too); non-complete trials add their
    reason."""
    duplicate = result.reason.startswith("same configuration")
    progress = " " * (len(str(n_trials)) * 2 + 3) if duplicate else f"[{finished:>{len(str(n_trials))}}/{n_trials}]"
    status = status_label(result.status, result.nan.cause)
    line = (
        f"{progress} #{number:<3} {format_params(params)}  "
        f"{status:<{STATUS_WIDTH}} {_num(result.memory.peak_memory_gib, '6.2f'):>6} GiB  "
        f"margin {margin_text(result.stress):>15}  "
        f"instability {format_instability(result.constant.instability):>7}  "
        f"{_num(result.provenance.wall_time_s, '6.1f'):>6} s"
    )
    if (
        result.provenance.warm is not None and not duplicate
    ):  # measured in a trial process: did it pay the imports, the load?
        line += "  " + (
            "warm, model kept" if result.provenance.model_reused else "warm" if result.provenance.warm else "cold"
        )
    if result.status != "complete" or duplicate:
        line += f"  ({result.reason})"
    return line


def format_trace(result: TrialResult) -> str:
    """The per-step trace of one trial as a table: step, loss, grad norm, max activation, skipped."""
    rows = [("step", "loss", "grad_norm", "max_activation", "skipped")]
    skipped = set(result.constant.skipped_steps)
    n = max(len(result.constant.loss_trace), len(result.constant.grad_norm_trace))
    for i in range(n):

        def at(seq: Sequence[Any], i: int = i) -> Any:
            return seq[i] if i < len(seq) else None

        loss, grad, act = (
            at(result.constant.loss_trace),
            at(result.constant.grad_norm_trace),
            at(result.constant.max_activation_trace),
        )
        rows.append(
            (
                str(i + 1),
                _num(loss, ".4f") if loss is not None else "non-finite",
                _num(grad, ".4g") if grad is not None else "non-finite",
                _num(act, ".4g"),
                "yes" if i + 1 in skipped else "",
            )
        )
    return _table(rows)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_front(
    front: Sequence[StoredTrial],
    objectives: Sequence[Objective] = (),
    picks: Mapping[str, StoredTrial] | None = None,
) -> str:
    """The Pareto front as a table: trial, r, lora_alpha, compute dtype, double quant, quant type, batch,
    max_seq_length, peak GiB, stability margin (``>=`` when capped), headroom (``predicted_max_lr /
    learning_rate`` with its interval, ``near edge`` below its safety factor: :class:`sweeper.stability.Headroom`),
    learning progress (the probe loss's drop at
    the trial's rate, ``barely`` under :data:`sweeper.stability.LEARNING_PROGRESS_SHARE` of the front's best),
    instability (the values come from each trial's stored config); a column for each objective of ``objectives``
    that is neither the memory nor the stability one (a registered third objective, shown by its
    :attr:`~sweeper.study.Objective.shown`); when two of them are tied on stability (their intervals overlap), a
    column ``tied`` naming the trials each is tied with; when any of them was confirmed (``sweep confirm``), a last
    column ``confirmed``: ``300 ok``, ``diverged@120`` ..., or ``-``.

    ``picks`` (pick name -> trial, :func:`sweeper.report._data.picks_block`) adds a column ``pick``; a picked trial
    off the front (``safe`` chooses among every complete trial) gets a row marked ``off the front``."""
    front, extra = _with_picks_off_front(front, picks or {})
    rows: list[tuple[str, ...]] = [
        (
            "trial",
            "r",
            "lora_alpha",
            "compute",
            "double_quant",
            "quant",
            "batch",
            "max_seq_length",
            "peak_GiB",
            "margin",
            "headroom",
            "learns",
            "instability",
            *(o.name for o in objectives if o.role is None),
        )
    ]
    best = max((t.result.constant.learning_progress or 0.0 for t in front), default=0.0)
    for t in front:
        c = t.config
        settings = (
            (
                c.r,
                t.lora_alpha,
                c.bnb_4bit_compute_dtype,
                c.bnb_4bit_use_double_quant,
                c.bnb_4bit_quant_type,
                c.per_device_train_batch_size,
                c.max_seq_length,
            )
            if c is not None
            else (None, t.lora_alpha, None, None, None, None, None)
        )
        values = t.values or (float("nan"), float("nan"))
        rows.append(
            (
                str(t.number),
                *(_fmt(v) for v in settings),
                f"{values[0]:.3f}",
                margin_text(t.result.stress),
                format_headroom(t.headroom),
                format_progress(t.result.constant.learning_progress, best),
                format_instability(t.result.constant.instability),
                *(
                    o.shown(t.result, t.values[i]) if t.values is not None else "-"
                    for i, o in enumerate(objectives)
                    if o.role is None
                ),
            )
        )
    ties = stability_ties(front, objectives)
    if any(ties.values()):
        column = ["tied"] + [",".join(f"#{n}" for n in ties.get(t.number, ())) or "-" for t in front]
        rows = [(*row, label) for row, label in zip(rows, column)]
    if any(t.confirmation is not None for t in front):
        labels = ["confirmed"] + [t.confirmation.label if t.confirmation else "-" for t in front]
        rows = [(*row, label) for row, label in zip(rows, labels)]
    if picks:
        rows = [(*row, label) for row, label in zip(rows, _pick_column(front, picks, extra))]
    return _table(rows)


def _with_picks_off_front(
    front: Sequence[StoredTrial], picks: Mapping[str, StoredTrial]
) -> tuple[Sequence[StoredTrial], set[int]]:
    """``front`` with the picked trials not on it added, in order of peak memory, and the numbers of those added."""
    on_front = {t.number for t in front}
    extra = {t.number: t for t in picks.values() if t.number not in on_front}
    if not extra:
        return front, set()
    return sorted([*front, *extra.values()], key=lambda t: (t.values or (float("inf"),))[0]), set(extra)


def _pick_column(rows: Sequence[StoredTrial], picks: Mapping[str, StoredTrial], off_front: set[int]) -> list[str]:
    """The front table's ``pick`` column: its header, then per row the picks choosing it (``-`` for none), marked
    ``(off the front)`` for the trials numbered in ``off_front``."""
    named = [", ".join(name for name, p in picks.items() if p.number == t.number) for t in rows]
    return ["pick"] + [(f"{n} (off the front)" if t.number in off_front else n) or "-" for n, t in zip(named, rows)]


def stability_ties(front: Sequence[StoredTrial], objectives: Sequence[Objective]) -> dict[int, list[int]]:
    """For each COMPLETE trial of ``front``, the others whose stability objective's interval overlaps its own
    (:meth:`~sweeper.study.Objective.signed_interval`, :meth:`~sweeper.study.Objective.tied`: the rule the front and
    the picks use): a difference within the noise. Empty without a stability objective."""
    at = next((i for i, o in enumerate(objectives) if o.role == "stability"), None)
    if at is None:
        return {}
    spans = {t.number: objectives[at].signed_interval(t.result, t.values[at]) for t in front if t.values is not None}
    return {
        n: [m for m, other in spans.items() if m != n and objectives[at].tied(mine, other)] for n, mine in spans.items()
    }


def trial_header(config: TrialConfig, setup: str, folder: Path) -> list[str]:
    """``sweep trial``'s first lines: the settings it runs (:func:`format_params`), ``setup`` (what it trains: the
    model, the data, the memory cap, as ``sweep run`` describes them) and the folder its files go to."""
    shown = {
        "r": config.r,
        "lora_alpha_ratio": config.lora_alpha_ratio,
        "bnb_4bit_compute_dtype": config.bnb_4bit_compute_dtype,
        "bnb_4bit_use_double_quant": config.bnb_4bit_use_double_quant,
        "bnb_4bit_quant_type": config.bnb_4bit_quant_type,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "max_seq_length": config.max_seq_length,
        "learning_rate": config.learning_rate,
    }
    return [f"sweep trial: {format_params(shown)}", setup, f"files   {folder}"]


def memory_line(result: TrialResult) -> str:
    """``memory  1.481 GiB (cpu_peak_rss): training steps 1.481, worst-case step (2 x 256) 1.344; measured apart:
    probe 1.001, stress 1.386, loading 1.188``: the judged peak, the phases it is the larger of, and the instrument's
    phases, each in GiB (:attr:`~sweeper.trial.MemoryReading.phase_peak_memory_gib`); the phases only where the
    trial recorded them."""
    memory = result.memory
    line = f"memory  {memory.peak_memory_gib:.3f} GiB ({memory.memory_kind})"
    phases = phase_peaks_text(memory.phase_peak_memory_gib, memory.worst_case_shape, digits=3, with_load=True)
    if phases is None:  # a result of an older version: the loading peak alone
        return line[:-1] + (
            f", {memory.load_peak_memory_gib:.3f} GiB while loading)" if memory.load_peak_memory_gib else ")"
        )
    return f"{line}: {phases}"


def trial_result_lines(result: TrialResult, config: TrialConfig, folder: Path) -> list[str]:
    """What ``sweep trial`` prints after its trial (run with ``config``, its files in ``folder``): the per-step trace
    (:func:`format_trace`), the status and reason, a NaN's cause and samples, the samples' lengths, the peak memory,
    the instability with its terms, the stability margin (:func:`margin_line`) and the times; each line only where
    the trial measured it."""
    lines = []
    if result.constant.loss_trace:
        lines.append(format_trace(result))
    lines.append(f"status  {result.status}: {result.reason}")
    if result.status == "nan":
        module = f", first non-finite output in {result.nan.module}" if result.nan.module else ""
        which = "samples at fault" if result.nan.cause == "data" else "samples of the failing step (not at fault)"
        lines.append(
            f"nan     cause {result.nan.cause or 'unknown'}{module}; {which}: "
            f"{', '.join(map(str, result.nan.samples)) or '-'}; the step's rows are in {folder / 'nan_batch.jsonl'}"
        )
    if result.data.longest_sample_tokens is not None:
        lines.append(
            f"data    samples trained on: the longest has {result.data.longest_sample_tokens} tokens before truncation "
            f"(sample {result.data.longest_sample_index}); "
            f"{100 * (result.data.truncated_sample_fraction or 0):.0f}% were cut at "
            f"max_seq_length={config.max_seq_length}; fewest supervised tokens in a step: "
            f"{result.data.min_supervised_tokens}"
        )
    if result.memory.peak_memory_gib is not None:
        lines.append(memory_line(result))
    if result.constant.data_token_share is not None:
        how = "samples packed into rows" if config.packing else "each micro-batch padded to its longest row"
        lines.append(
            f"tokens  {100 * result.constant.data_token_share:.0f}% of the tokens the training steps processed are the "
            f"data's own ({how})"
        )
    if result.constant.instability is not None:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in result.constant.instability_components.items())
        lines.append(f"instability {format_instability(result.constant.instability)} ({parts})")
    if result.stress.stop is not None:
        lines.append(margin_line(result, config.learning_rate))
    phases = (
        ("import", result.provenance.import_time_s),
        ("load", result.provenance.load_time_s),
        ("train", result.constant.train_time_s),
    )
    times = [f"{phase} {seconds:.1f} s" for phase, seconds in phases if seconds is not None]
    if result.provenance.wall_time_s is not None:
        times.append(f"total {result.provenance.wall_time_s:.1f} s")
    lines.append("time    " + ", ".join(times))
    return lines


def legacy_instability_warning(study: StudyLike) -> str | None:
    """One line when the study mixes, or holds, instabilities of sweeper 0.1.0's definition
    (:attr:`sweeper.study.StoredTrial.legacy_instability`), else None."""
    old = [t.number for t in snapshot(study).measured if t.legacy_instability]
    if not old:
        return None
    shown = ", ".join(map(str, old[:8])) + (f" and {len(old) - 8} more" if len(old) > 8 else "")
    return (
        f"WARNING instability: {len(old)} trial{'s' if len(old) > 1 else ''} of this study ({shown}) measured it with "
        "sweeper 0.1.0's definition (the training loss's spikes, which a run that learns nothing scores ~0.6 on), "
        "not the probe's: the front compares the two; start a new study (--study NAME) to compare like with like"
    )


def other_setups_line(study: StudyLike) -> str | None:
    """One line when the study holds measured trials of setups other than its current one: how many, what differs
    (each other setup's settings against the current one's, :meth:`sweeper.study.StudySnapshot.other_setups`), and
    that they are kept apart; else None."""
    mine, others = snapshot(study).other_setups()
    if not others:
        return None
    parts = [
        f"{n} under settings this version cannot tell" if changed is None else f"{n} with {', '.join(changed)}"
        for n, changed in others
    ]
    total = sum(n for n, _ in others)
    return (
        f"note    {total} measured trial{'s' if total != 1 else ''} of this study {'were' if total != 1 else 'was'} "
        f"measured under other settings ({'; '.join(parts)}): kept apart, the front, the picks and the exports "
        f"compare the {mine} of the current settings"
    )


def margin_text(stress: StressOutcome | StabilityFigures) -> str:
    """A trial's margin with its seed-noise interval (:func:`sweeper.stability.format_margin_range`), from its stored
    stress phase or a report row's :class:`~sweeper.stability.StabilityFigures`."""
    return format_margin_range(
        stress.stability_margin, stress.margin_capped, stress.stability_margin_low, stress.stability_margin_high
    )


def predicted_text(stress: StressOutcome | StabilityFigures) -> str:
    """``predicted_max_lr`` with its 95% interval and which factor made it: ``3.36e-03 (1.5e-03-7.5e-03;
    uncalibrated: factor from SmolLM2-135M (8 edges, geometric SD 1.51))``; ``-`` when unknown."""
    shown = format_rate_range(stress.predicted_max_lr, stress.predicted_max_lr_low, stress.predicted_max_lr_high)
    if shown == "-" or not stress.predicted_max_lr_source:
        return shown
    if shown.endswith(")"):
        return f"{shown[:-1]}; {stress.predicted_max_lr_source})"
    return f"{shown} ({stress.predicted_max_lr_source})"


def margin_line(result: TrialResult, learning_rate: float | None = None) -> str:
    """``margin  36x (20-65x, seed noise) the learning rate (lr_ceiling 7.1e-03, stress diverged after 6 of 11 steps,
    38% of the constant phase's time); predicted_max_lr 1.8e-03 (8e-04-4e-03; uncalibrated: ...) for a long run,
    headroom 9x (4-20x) its learning rate; learning progress 21%``; the headroom only with the trial's
    ``learning_rate``, ``near edge`` in it when it is (:class:`sweeper.stability.Headroom`)."""
    stress = result.stress
    ceiling = "-" if stress.lr_ceiling is None else f"{stress.lr_ceiling:.3g}"
    share = "" if stress.time_share is None else f", {100 * stress.time_share:.0f}% of the constant phase"
    progress = "-" if result.constant.learning_progress is None else f"{100 * result.constant.learning_progress:.0f}%"
    margin = format_margin_range(
        stress.stability_margin,
        stress.margin_capped,
        stress.stability_margin_low,
        stress.stability_margin_high,
        source=True,
    )
    h = headroom_of(learning_rate, stress)
    headroom = "" if h is None else f", headroom {format_headroom(h)} its learning rate"
    return (
        f"margin  {margin} the learning rate (lr_ceiling {ceiling}; stress {stress.stop} after {stress.steps} "
        f"steps{share}); predicted_max_lr {predicted_text(stress)} for a long run"
        f"{' (a lower bound)' if stress.margin_capped else ''}{headroom}; learning progress {progress}"
    )


def format_progress(progress: float | None, best: float) -> str:
    """A learning progress as a percentage (``21%``), with ``(barely)`` when it is under
    :data:`~sweeper.stability.LEARNING_PROGRESS_SHARE` of ``best`` (the front's, or the study's, largest); ``-`` when
    unknown."""
    if progress is None:
        return "-"
    return f"{100 * progress:.0f}%" + (" (barely)" if barely_learns(progress, best) else "")


def format_counts(counts: Mapping[str, int], nan_causes: Mapping[str, Sequence[int]] | None = None) -> str:
    """``complete 7 · nan 2 (data 1, precision 1) · oom 2`` in a fixed order, then any other status.

    Args:
        counts: Trials by status (:func:`sweeper.study.status_counts`).
        nan_causes: NaN trial numbers by cause (:func:`sweeper.study.nan_causes`), shown after the NaN count.
    """
    order = [
        "complete",
        "nan",
        "diverged",
        "oom",
        "predicted_oom",
        "dominated_oom",
        "timeout",
        "crash",
        "error",
        "running",
        "stale",
        "waiting",
        "interrupted",
        "repeated",
    ]
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    parts = []
    for k in keys:
        part = f"{k} {counts[k]}"
        if k == "nan" and nan_causes:
            part += " (" + ", ".join(f"{cause} {len(nums)}" for cause, nums in nan_causes.items()) + ")"
        parts.append(part)
    return " · ".join(parts)


def format_data_nan_summary(
    nan_causes: Mapping[str, Sequence[int]], samples: Mapping[int, Sequence[int]], trials_dir: str
) -> str:
    """One line naming the NaN trials the data caused (empty when none): so that they are not read as a result about
    the hyperparameters.

    Args:
        nan_causes: NaN trial numbers by cause.
        samples: ``nan_samples`` of each trial, by trial number.
        trials_dir: The study's trial folders (``studies/<study>/trials``), where ``nan_batch.jsonl`` lies.
    """
    data = list(nan_causes.get("data", ()))
    if not data:
        return ""
    total = sum(len(v) for v in nan_causes.values())
    blamed = sorted({i for n in data for i in samples.get(n, ())})
    head = (
        f"all {total} NaN trials were"
        if total == len(data) and total > 1
        else "the NaN trial was"
        if total == 1
        else f"{len(data)} of {total} NaN trials were"
    )
    shown = ", ".join(str(i) for i in blamed[:8]) + (f" and {len(blamed) - 8} more" if len(blamed) > 8 else "")
    folder = f"{trials_dir}/{data[0] if len(data) == 1 else '<trial>'}/nan_batch.jsonl"
    return (
        f"{head} caused by the data, not the hyperparameters: trial{'s' if len(data) > 1 else ''} "
        f"{', '.join('#' + str(n) for n in data)}, sample{'s' if len(blamed) != 1 else ''} {shown} "
        f"(rows in {folder})"
    )


def format_audit(report: AuditReport) -> str:
    """``sweep doctor``'s table: token-length percentiles, then one row per finding (kind, max_seq_length, number of
    samples, detail), then whether anything would make a trial NaN."""
    p = report.length_percentiles
    lines = [
        "tokens per sample (chat template included, before truncation): "
        + "  ".join(f"{k} {v:g}" for k, v in p.items())
    ]
    lengths = ", ".join(str(n) for n in report.max_seq_lengths)
    if report.findings:
        rows = [("kind", "max_seq_length", "samples", "detail")]
        rows += [
            (f.kind, "-" if f.max_seq_length is None else str(f.max_seq_length), str(len(f.samples)), f.detail)
            for f in report.findings
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        table = ["  ".join([c.ljust(w) for c, w in zip(r[:3], widths)] + [r[3]]) for r in rows]
        table.insert(1, "  ".join("-" * w for w in widths) + "  ------")
        lines += ["", *table]
    else:
        lines += ["", "no findings"]
    nan = report.nan_findings
    lines.append("")
    if nan:
        where = sorted({f.max_seq_length for f in nan if f.max_seq_length is not None})
        lines.append(
            (f"NaN risk at max_seq_length {', '.join(map(str, where))}: " if where else "NaN risk: ")
            + "; ".join(
                f"{f.kind}{'' if f.max_seq_length is None else f' at {f.max_seq_length}'} "
                f"({len(f.samples)} sample{'s' if len(f.samples) != 1 else ''})"
                for f in nan
            )
        )
    else:
        lines.append(f"no finding would make a trial NaN at max_seq_length {lengths}")
    return "\n".join(lines)


def format_data_warnings(
    report: AuditReport, risks: Sequence[NanRisk], *, several_accumulations: bool, doctor: str
) -> list[str]:
    """Before the first trial: one ``WARNING data:`` line per finding that would make trials NaN (naming the batch
    sizes and the step where it strikes), or one ``data`` line saying there is none; other findings are named after.

    Args:
        report: The audit at the searched ``max_seq_length`` values.
        risks: :func:`sweeper.audit.nan_risks` of its NaN findings.
        several_accumulations: The sweep searches ``gradient_accumulation_steps`` (then named in the strike).
        doctor: The ``sweep doctor`` command to point to.
    """
    lines = []
    for risk in risks:
        finding, hits = risk.finding, risk.strikes
        if hits:
            (b, ga), hit = min(hits.items(), key=lambda kv: kv[1].step)
            sizes = ", ".join(sorted({str(k[0]) for k in hits}, key=int))
            strikes = (
                f"batch {sizes} go{'es' if len(hits) == 1 else ''} NaN (batch {b}"
                + (f", gradient_accumulation_steps {ga}" if several_accumulations else "")
                + f": step {hit.step}, sample{'s' if len(hit.samples) > 1 else ''} "
                f"{', '.join(map(str, hit.samples[:6]))})"
            )
        else:
            strikes = f"no step of the first {risk.max_steps} is made only of them, a longer run would be"
        if finding.kind == "bad_embedding_row":
            lines.append(
                f"WARNING data: {finding.detail}; {strikes}: a data fault, not a hyperparameter result ({doctor})"
            )
            continue
        what = {
            "no_supervised_tokens": "no supervised token left (the reply is cut away)",
            "invalid_token_id": f"token ids outside the model's {report.vocab_size} embedding rows",
        }.get(finding.kind, finding.kind)
        lines.append(
            f"WARNING data: at max_seq_length={finding.max_seq_length}, {len(finding.samples)} of "
            f"{report.samples} samples have {what}; {strikes}: a data fault, not a hyperparameter result "
            f"({doctor})"
        )
    others = sorted({f.kind for f in report.findings if not f.nan_risk})
    if not lines:
        lines.append(
            f"data    audited at max_seq_length {', '.join(map(str, report.max_seq_lengths))}: nothing that "
            "would make a trial NaN" + (f"; also found: {', '.join(others)} ({doctor})" if others else "")
        )
    elif others:
        lines.append(f"data    also found: {', '.join(others)} ({doctor})")
    return lines


def format_dropped_rows(dropped: Sequence[Any], rows: int, path: str, *, doctor: str) -> str | None:
    """One ``WARNING data:`` line for the dataset rows a trial will not train on, counted by reason (None when
    every row is used), so that no row is left out silently.

    Args:
        dropped: :func:`sweeper.data.unused_rows` (``index`` and ``reason`` each).
        rows: Rows in the dataset (``load_samples(...).rows``).
        path: ``dataset.path``, to name the file.
        doctor: The ``sweep doctor`` command that lists them.
    """
    if not dropped:
        return None
    groups: dict[str, list[int]] = {}
    for d in dropped:
        groups.setdefault(d.reason, []).append(d.index)
    parts = []
    for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1]))):
        indices = sorted(indices)
        shown = ", ".join(str(i) for i in indices[:5]) + (f" and {len(indices) - 5} more" if len(indices) > 5 else "")
        parts.append(f"{len(indices)} {reason} (row{'s' if len(indices) != 1 else ''} {shown})")
    total = len(dropped)
    return (
        f"WARNING data: {total} of {rows} rows of {path} {'is' if total == 1 else 'are'} not trained on: "
        f"{'; '.join(parts)} ({doctor})"
    )


def format_memory_prediction(prediction: MemoryPrediction) -> str | None:
    """One line of ``sweep report``: the preflight's median error before and after its correction
    (:func:`sweeper.report._data.memory_prediction_data`); None without a complete trial that had a prediction."""
    if prediction.median_error is None:
        return None
    n = sum(1 for r in prediction.trials if r.error is not None)
    line = (
        f"memory  predicted vs measured peak: median error {100 * prediction.median_error:.0f}% over {n} "
        f"trial{'s' if n != 1 else ''}"
    )
    if prediction.median_corrected_error is not None:
        corrected = prediction.corrected_trials
        line += (
            f", {100 * prediction.median_corrected_error:.0f}% after the study's correction "
            f"({corrected} trial{'s' if corrected != 1 else ''} predicted with it)"
        )
    return line


def format_same_rows(max_seq_lengths: Sequence[int], longest_sample_tokens: int | None, packing: bool) -> str | None:
    """One line naming the ``max_seq_length`` values that train the same rows on this data: every value at or above
    its longest tokenized sample truncates nothing, and padding each micro-batch to its longest row gives the same
    steps at each (``max_seq_length 2048 and 4096 train the same rows on this data (longest 1,320 tokens)``). None
    when fewer than two values do, the longest is unknown, or samples are packed (a packed row fills up to
    ``max_seq_length``: each value trains other rows)."""
    if longest_sample_tokens is None or packing:
        return None
    same = sorted({n for n in max_seq_lengths if n >= longest_sample_tokens})
    if len(same) < 2:
        return None
    values = ", ".join(map(str, same[:-1])) + f" and {same[-1]}"
    return (
        f"max_seq_length {values} train the same rows on this data (longest {longest_sample_tokens:,} tokens): "
        f"a sweep measures one and settles the others as its repeats"
    )


def format_cap(limit_gib: float, auto: bool, card_name: str | None, card_gib: float | None, device: str) -> str:
    """The cap with the device it is of: ``cap 23.15 GiB (auto) of the card's 23.65 GiB (NVIDIA GeForce RTX
    4090)``, ``cap 1.6 GiB of this machine's 23.54 GiB``, or ``cap 22 GiB`` when the device was not read."""
    text = f"cap {limit_gib:g} GiB" + (" (auto)" if auto else "")
    if card_gib is None:
        return text
    if device == "cpu":
        return f"{text} of this machine's {card_gib:.2f} GiB"
    return f"{text} of the card's {card_gib:.2f} GiB ({card_name})"


def front_axis(study: StudyLike) -> str:
    """``stability margin``, or ``instability`` for a study written before the margin: the front's second axis;
    ``stability margin vs learning progress`` in a study with ``learning_progress`` as its third."""
    objectives = snapshot(study).objectives
    axis = "stability margin" if any(o.name == "edge_proximity" for o in objectives) else "instability"
    return axis + (" vs learning progress" if any(o.role == "learning" for o in objectives) else "")
