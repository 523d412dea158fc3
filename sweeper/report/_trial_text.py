"""One trial, as the commands print it: its line in ``sweep run``, its trace, ``sweep trial``'s header and result
lines, its memory and margin lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeper.notation import format_chance, format_headroom, format_instability, format_margin_range
from sweeper.report._console import STATUS_WIDTH, _num, _table, format_params, margin_text, predicted_text, status_label
from sweeper.report._records import phase_peaks_text
from sweeper.space import TrialConfig
from sweeper.stability import StabilityFigures, headroom_of
from sweeper.trial import TrialResult, TrialStatus


def format_trial_line(
    number: int, params: Mapping[str, Any], result: TrialResult, finished: int, n_trials: int, *, repeat: bool = False
) -> str:
    """One line per finished trial: progress, number, searched values, status (with the NaN cause), peak GiB,
    stability margin, instability, seconds, whether its trial process was ``cold`` (a fresh process), ``warm``
    (imports paid by an earlier trial) or ``warm, model kept`` (the 4-bit model too); non-complete trials add their
    reason. A ``repeat`` (a configuration already measured, or one that trains the same rows: the trial's
    ``duplicate_of``) has no progress counter and no process temperature, and always gives its reason."""
    duplicate = repeat
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
    if result.status != TrialStatus.COMPLETE or duplicate:
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


def cached_memory_line(result: TrialResult) -> str | None:
    """``memory  2.41 of the 12.80 GiB reserved at the peak was the CUDA allocator's cache, not tensors (19%): ...``
    where that share is over :attr:`~sweeper.trial.MemoryReading.CACHED_SHARE_SAID` and the trial did not already
    run with ``expandable_segments:True``; None otherwise (the CPU, older trials)."""
    memory = result.memory
    share = memory.cached_share()
    if share is None or memory.peak_memory_gib is None:
        return None
    if not memory.cache_worth_saying(share, result.provenance.cuda_alloc_conf):
        return None
    cached = memory.peak_memory_gib * share
    return (
        f"memory  {cached:.2f} of the {memory.peak_memory_gib:.2f} GiB reserved at the peak was the CUDA allocator's "
        f"cache, not tensors ({share:.0%}): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually returns most "
        "of it (set it for the sweep and the production run alike)"
    )


def trial_result_lines(result: TrialResult, config: TrialConfig, folder: Path) -> list[str]:
    """What ``sweep trial`` prints after its trial (run with ``config``, its files in ``folder``): the per-step trace
    (:func:`format_trace`), the status and reason, a NaN's cause and samples, the samples' lengths, the peak memory,
    the instability with its terms, the stability margin (:func:`margin_line`) and the times; each line only where
    the trial measured it."""
    lines = []
    if result.constant.loss_trace:
        lines.append(format_trace(result))
    lines.append(f"status  {result.status}: {result.reason}")
    if result.status == TrialStatus.NAN:
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
    if (line := worst_case_data_line(result, config.max_seq_length)) is not None:
        lines.append(line)
    if result.memory.peak_memory_gib is not None:
        lines.append(memory_line(result))
        if (cached := cached_memory_line(result)) is not None:
            lines.append(cached)
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


def worst_case_data_line(result: TrialResult, max_seq_length: int) -> str | None:
    """What the worst-case step trained when its loss was over zero tokens (issue 68): ``WARNING data: the
    worst-case step (rows 280) keeps no supervised token at max_seq_length 512: ...``; None otherwise."""
    if result.data.worst_case_supervised_tokens != 0:
        return None
    rows = ", ".join(map(str, result.data.worst_case_rows)) or "-"
    return (
        f"WARNING data: the worst-case step (the data's longest rows: {rows}) keeps no supervised token at "
        f"max_seq_length {max_seq_length}: its loss was computed over zero tokens, so a step of these rows alone is "
        "a NaN in a run over this file; drop them, or raise max_seq_length above their reply's start"
    )


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
    chance = ""
    if h is not None and stress.p_diverge is not None:
        figures = StabilityFigures.of(stress, h)
        chance = f"; P(diverges within {stress.horizon_steps} steps) {format_chance(figures)}"
        if stress.safe_learning_rate is not None:
            chance += f", safe at learning_rate {stress.safe_learning_rate:.3g}"
    return (
        f"margin  {margin} the learning rate (lr_ceiling {ceiling}; stress {stress.stop} after {stress.steps} "
        f"steps{share}); predicted_max_lr {predicted_text(stress)} (the edge: a long run there fails about half the "
        f"time){' (a lower bound)' if stress.margin_capped else ''}{headroom}{chance}; learning progress {progress}"
    )
