"""What each format's exported run peaked at in its own tool against the trial it was exported from (issue 57).

Measured by ``benchmarks/export_peak.py --repeats 4`` on this project's CPU machine (:data:`EXPORT_PEAK_RESULTS`):
the demo's trial #2 configuration (SmolLM2-135M-Instruct, r 16, fp4 with double quant, batch 2 x 64, float32
compute, gradient checkpointing, paged AdamW 8-bit) as a one-trial study, its export trained in each tool for 2
optimizer steps at the export's accumulation, counted as the trial counts on the CPU (the resident set's peak once
the model is loaded and adapted, the free heap handed back first). ``tests/export/test_export.py`` holds
:data:`EXPORT_PEAKS` to that file's medians, and every format's file to :func:`measured_peak_line`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The committed measurement the figures below come from (relative to the repository).
EXPORT_PEAK_RESULTS = "benchmarks/results/export_peak_4.txt"
#: The trial's stated memory noise between runs on the CPU, GiB (``sweep run``'s memory line: "+-0.1 GiB").
CPU_MEMORY_NOISE_GIB = 0.1


@dataclass(frozen=True)
class ExportPeak:
    """One format's exported run, measured in its tool (medians of the runs in :data:`EXPORT_PEAK_RESULTS`).

    Attributes:
        tool: What trained the file, with its version.
        difference_gib: The run's median peak less the trial's median peak, GiB.
        before_training_gib: The run's median resident set when training began less the ``hf`` run's, GiB: what the
            tool's own process held beyond transformers' (its imports, its prepared dataset); on a GPU that is host
            memory, not the card's.
        in_steps_gib: The run's median growth during training (peak less the resident set when training began) less
            the ``hf`` run's, GiB: what its steps held beyond the trial's own stack.
        why: What is known of the difference, one clause, or ``""``.
    """

    tool: str
    difference_gib: float
    before_training_gib: float
    in_steps_gib: float
    why: str = ""


#: Each format's measured run (``json`` is the ``hf`` file's settings and ``policy`` a guard: neither trains).
EXPORT_PEAKS = {
    "hf": ExportPeak("transformers' Trainer", 0.10, 0.0, 0.0),
    "trl": ExportPeak(
        "TRL 1.16.0's SFTTrainer",
        0.20,
        0.03,
        0.07,
        "its steps' excess is TRL's own loss step (its tiled loss with its per-step metrics): TRL's trainer with "
        "transformers' loss over the full logits peaked +0.11, and TRL's own about 0.17 GiB higher again in 3 of 7 "
        "runs, never with that loss; leave that much more room under the card",
    ),
    "axolotl": ExportPeak(
        "axolotl 0.21.0",
        0.25,
        0.17,
        -0.02,
        "the excess is axolotl's process before training (its imports alone 0.14 GiB more than transformers' and "
        "peft's), host memory on a GPU, not the card's; its steps held no more than the trial's own stack",
    ),
    "llama-factory": ExportPeak(
        "LLaMA-Factory 0.9.5",
        0.35,
        0.29,
        -0.05,
        "the excess is LLaMA-Factory's process before training (its imports alone 0.17 GiB more than transformers' "
        "and peft's), host memory on a GPU, not the card's, though it holds its float16 embeddings in 0.05 GiB less; "
        "its steps held no more than the trial's own stack. Run with bf16: false and upcast_layernorm: false, so that "
        "it computed in float32 as the trial (torch's CPU autocast fails in its bfloat16)",
    ),
}


def measured_peak_line(fmt: str) -> str | None:
    """The header line of a ``fmt`` file on its run's measured peak (:data:`EXPORT_PEAKS`), or None for a format
    that does not train. Whether the difference is within the trial's noise (:data:`CPU_MEMORY_NOISE_GIB`), and how
    much of it the tool's process held before training began and how much its steps held beyond the ``hf`` run."""
    peak = EXPORT_PEAKS.get(fmt)
    if peak is None:
        return None
    within = "within" if abs(peak.difference_gib) <= CPU_MEMORY_NOISE_GIB else "beyond"
    parts = f"{peak.difference_gib:+.2f} GiB against the trial it was exported from, {within} the trial's "
    parts += f"{CPU_MEMORY_NOISE_GIB} GiB noise"
    if fmt != "hf":
        parts += (
            f" ({peak.before_training_gib:+.2f} GiB held before training began against the hf file's run, "
            f"{peak.in_steps_gib:+.2f} GiB in its steps)"
        )
    why = f"; {peak.why}" if peak.why else ""
    return (
        f"Measured in {peak.tool} on the CPU (SmolLM2-135M at batch 2 x 64, median of 4 runs, "
        f"{EXPORT_PEAK_RESULTS} of sweeper's repository): its run peaked {parts}{why}."
    )
