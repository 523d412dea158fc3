"""The header every export writes above its settings: where the trial came from, its stability figures and margin,
the batch it was measured at and what the export changes."""

from __future__ import annotations

from sweeper.export._settings import DATASET_NOTE, RUN_LENGTH_NOTE, ExportSettings, Provenance
from sweeper.notation import format_chance
from sweeper.stability import StabilityFigures
from sweeper.trial import CUDA_ALLOC_CONF_NOT_APPLICABLE, MemoryReading


def _margin_sentence(p: Provenance) -> str:
    """What the stress phase measured, for the export's header."""
    f = p.stability
    if f.stability_margin is None:
        return "Stability margin: not measured (a study written before it, or its stress phase did not finish)."
    bound = ">= " if f.margin_capped else ""
    ceiling = "none up to the cap" if f.lr_ceiling is None else f.lr_ceiling
    noise = _interval("seed noise: ", f.stability_margin_low, f.stability_margin_high, "x")
    interval = _interval("95%: ", f.predicted_max_lr_low, f.predicted_max_lr_high)
    source = f"; {f.predicted_max_lr_source}" if f.predicted_max_lr_source else ""
    if f.headroom is None:
        headroom = ""
    else:
        span = f">= {f.headroom_low}x" if f.headroom_high is None else f"{f.headroom_low}x-{f.headroom_high}x"
        headroom = f" The edge lies {bound}{f.headroom}x this learning rate (95%: {span})."
    return (
        f"Stability margin {bound}{f.stability_margin}x the learning rate{noise} (the stress phase diverged at "
        f"lr_ceiling {ceiling}); predicted_max_lr {f.predicted_max_lr}{interval}{source}: the edge, a constant "
        f"learning rate at which a long run fails about half the time.{headroom}{_chance_sentence(f)}"
    )


def _chance_sentence(f: StabilityFigures) -> str:
    """The chance of diverging within the run at this learning rate, its call, and the safe rate."""
    if f.p_diverge is None or f.horizon_steps is None:
        return ""
    call = {"safe": "SAFE", "undecided": "UNDECIDED", "likely fails": "LIKELY FAILS"}.get(f.stability_call or "", "")
    safe = (
        ""
        if f.safe_learning_rate is None
        else f"; learning_rate <= {f.safe_learning_rate} is safe for {f.horizon_steps} steps"
    )
    return (
        f" Chance a {f.horizon_steps}-step run at this learning rate diverges: {format_chance(f, call=False)} "
        f"(95%), {call}{safe}. The chance grows with the run's length: these figures are for {f.horizon_steps} "
        "steps (sweep export --horizon, else the study's confirm_steps, else 400), a longer run is riskier at the same "
        "rate; export again with --horizon set to your run's steps (docs/validity.md: the model and its validation)."
    )


def _interval(what: str, low: float | None, high: float | None, unit: str = "") -> str:
    """`` (WHAT LOW-HIGH)`` with ``unit`` after each end, `` (WHAT >= LOW)`` without a high end, empty without a low
    one."""
    if low is None:
        return ""
    if high is None:
        return f" ({what}>= {low}{unit})"
    return f" ({what}{low}{unit}-{high}{unit})"


def _batch_sentence(s: ExportSettings) -> str:
    """At which effective batch the stability figures and the confirmation were measured, against the export's."""
    p, t = s.provenance, s.training
    exported = s.effective_batch_size
    measured = p.measured_effective_batch_size
    done = p.confirmation
    confirmed_at = None if done is None else exported if done.as_exported else done.effective_batch_size or measured
    if done is None:
        confirmed = ""
    elif confirmed_at == exported:
        confirmed = "; its confirmation ran as exported"
    else:
        confirmed = f"; its confirmation ran at {confirmed_at}, not as exported ('sweep confirm --as-exported' runs it)"
    if exported == measured:
        return f"The stability figures were measured at this export's effective batch, {measured}{confirmed}."
    return (
        f"The stability figures were measured at effective batch {measured}; this export trains at {exported} "
        f"(gradient_accumulation_steps {t.gradient_accumulation_steps}), at which they were not measured{confirmed}."
    )


#: The ``memory_kind`` of a peak measured on the CPU (:mod:`sweeper.trial`): the process's peak resident set.
CPU_PEAK_KIND = "cpu_peak_rss"
#: The header's line under a CPU trial's peak: what it counts, and that a card's peak is another figure. The
#: figures: benchmarks/memory/results/export_imports.txt (VmRSS 0.50-0.56 GiB after importing torch,
#: transformers, peft, bitsandbytes and datasets, of which RssFile 0.14-0.19).
CPU_PEAK_LINE = (
    "On the CPU the peak is the trial process's resident memory on the host, the interpreter and its libraries "
    "included (about 0.5 GiB after importing torch and transformers, 0.14-0.19 of it mapped library files), not a "
    "card's: on a GPU the same configuration peaks otherwise, counting only the card's memory. Before a GPU run, "
    "sweep the space on the card, or let `sweep estimate SPACE --device cuda` predict its peak from the memory model."
)


def _measured_under(s: ExportSettings, trl: bool) -> str:
    """The settings the trial ran under that move its peak and that a production stack may choose otherwise: the
    attention, the loss kernel, checkpointing, the optimizer, the compute dtype and (on CUDA) the allocator, with how
    to run as measured (issue 57). TRL's own loss is named only in the ``trl`` file (``trl``): transformers' Trainer,
    which the ``hf`` file, axolotl and LLaMA-Factory train with, computes the loss over the full logits as the trial
    did."""
    alloc = s.provenance.cuda_alloc_conf
    if alloc is None:
        allocator = "the CUDA allocator's configuration was not recorded (a trial of an older version)"
    elif alloc == CUDA_ALLOC_CONF_NOT_APPLICABLE:
        allocator = "on the CPU, where the CUDA allocator's configuration moves nothing"
    elif alloc:
        allocator = f"PYTORCH_CUDA_ALLOC_CONF={alloc} (run with it set: it moves the reserved peak)"
    else:
        allocator = (
            "PYTORCH_CUDA_ALLOC_CONF unset, PyTorch's default (run without it to peak as measured; "
            "expandable_segments:True reserves less)"
        )
    share = s.provenance.cached_share
    if MemoryReading.cache_worth_saying(share, alloc):
        allocator += (
            f"; {share:.0%} of the reserved peak was the allocator's cache, not tensors "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True returns most of it)"
        )
    t = s.training
    return (
        f"Measured under: attention {s.collation.attn_implementation}; the loss as cross-entropy over the full logits"
        + (" (TRL 1.14's loss_type nll; TRL 1.16's nll is tiled without them and peaks otherwise)" if trl else "")
        + "; the 4-bit model "
        "prepared as the QLoRA recipe does (peft's prepare_model_for_kbit_training: the weights outside the 4-bit "
        "layers in float32); gradient checkpointing "
        f"{'on' if t.gradient_checkpointing else 'off'}; optimizer "
        f"{t.optim}; compute dtype {s.quantization.bnb_4bit_compute_dtype}; {allocator}."
    )


def environment_line(s: ExportSettings, sets_it: bool) -> str | None:
    """The header's line of the environment the run must start with (:attr:`ExportSettings.environment`), None when
    it sets nothing: the file sets it itself (``sets_it``: the ``hf`` and ``trl`` files, before torch is imported), or
    the user starts the run with it (a YAML file cannot set a process's environment)."""
    if not s.environment:
        return None
    pairs = " ".join(f"{k}={v}" for k, v in s.environment.items())
    how = (
        "this file sets it before importing torch (import it before torch, or export it yourself)"
        if sets_it
        else f"a YAML file cannot set it: start the run with it (`{pairs} <the training command>`)"
    )
    if s.provenance.cuda_alloc_conf in (None, CUDA_ALLOC_CONF_NOT_APPLICABLE):
        source = "as the trial's expandable_segments asks (not measured: the trial ran on the CPU)"
    else:
        source = "as the trial ran"
    return f"Environment: {pairs}, {source}; the CUDA allocator reads it when torch starts; {how}."


def header(
    s: ExportSettings, comment: str, dataset_given: bool = False, sets_environment: bool = False, trl: bool = False
) -> list[str]:
    """The lines every format starts with, each after ``comment``: where the settings come from, what was measured
    (and, for a CPU trial, that its peak is not a card's: :data:`CPU_PEAK_LINE`), the library versions and the notes
    (with ``dataset_given``, the export writes the dataset entry itself: the note asks for the run's length only;
    ``sets_environment``: the file sets the run's environment itself, :func:`environment_line`; ``trl``: the ``trl``
    file, whose loss is TRL's, :func:`_measured_under`)."""
    p = s.provenance
    notes = [RUN_LENGTH_NOTE if n == DATASET_NOTE and dataset_given else n for n in s.notes]
    versions = ", ".join(f"{k} {v}" for k, v in p.versions if v)
    lines = [
        f"Exported by sweeper from study '{p.study}', trial {p.trial} ({p.exported}).",
        f"Measured: peak memory {p.peak_memory_gib} GiB ({p.memory_kind}, cap {p.memory_limit_gib} GiB), "
        f"instability {p.instability}, on {p.device}.",
        *([CPU_PEAK_LINE] if p.memory_kind == CPU_PEAK_KIND else []),
        _margin_sentence(p),
        _batch_sentence(s),
        s.collation.sentence(s.max_seq_length),
        _measured_under(s, trl),
        *filter(None, [environment_line(s, sets_environment)]),
        f"Versions: {versions}.",
        *notes,
    ]
    return [f"{comment} {line}" for line in lines]
