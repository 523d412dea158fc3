"""The ``axolotl`` export: an axolotl config (``adapter: qlora``) in the keys of axolotl 0.21's schema."""

from __future__ import annotations

from sweeper.errors import StudyError
from sweeper.export._dataset import ExportData, axolotl_dataset
from sweeper.export._format import ExportFormat, Limit
from sweeper.export._header import header
from sweeper.export._peaks import measured_peak_line
from sweeper.export._settings import ExportSettings
from sweeper.export._yaml import same_named_training, yaml_text
from sweeper.study import StoredTrial

#: axolotl's fused LoRA kernels (its ``lora_optims``), which it switches on by default for QLoRA: written as off,
#: since the trial ran peft's own layers.
AXOLOTL_LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")


def render_axolotl(s: ExportSettings, data: ExportData | None = None) -> str:
    """An axolotl config (``adapter: qlora``), in the keys of axolotl 0.21's schema. axolotl derives
    ``bnb_4bit_compute_dtype`` from its ``bf16``/``fp16`` flags; the trial's value is passed through
    ``bnb_config_kwargs``, which axolotl merges into its ``BitsAndBytesConfig``. Two of axolotl's defaults would
    train otherwise than the trial: ``tf32: auto`` turns TF32 matmuls on for Ampere and newer GPUs (the trial ran
    PyTorch's default, full float32 matmuls), and ``excess_length_strategy`` defaults to ``drop`` for rows longer
    than ``sequence_len`` (the trial truncated them): both are written out, and so are axolotl's fused LoRA kernels
    (:data:`AXOLOTL_LORA_KERNELS`), as off. The trial's collation (:func:`_collation`): ``sample_packing`` and
    ``pad_to_sequence_len``, and with packing the trial's ``attn_implementation``. With ``data``, the ``datasets``
    entry and ``chat_template`` of the trial's rows (:func:`sweeper.export._dataset.axolotl_dataset`), or a comment
    saying why they could not be read.

    Raises:
        StudyError: The trial's ``lora_alpha`` is not a whole number (axolotl's is an integer:
            :func:`sweeper.export.inexpressible`).
    """
    t, q, lora, p = s.training, s.quantization, s.lora, s.provenance
    alpha = lora.lora_alpha
    if not float(alpha).is_integer():
        raise StudyError(
            f"{p.study}: --format axolotl: trial {p.trial} has lora_alpha {alpha}, not a "
            "whole number, which axolotl cannot express (its lora_alpha is an integer); export it with --format hf, "
            "trl or llama-factory"
        )
    entry, entry_comments = axolotl_dataset(data.rows, data.folder) if data and data.rows else ({}, {})
    out = {
        "base_model": s.model,
        "load_in_4bit": True,
        "adapter": "qlora",
        "lora_r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "lora_target_modules": list(lora.target_modules),
        "bnb_config_kwargs": {
            "bnb_4bit_quant_type": q.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": q.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": q.bnb_4bit_compute_dtype,
        },
        **entry,
        "sequence_len": s.max_seq_length,
        "excess_length_strategy": "truncate",
        **_collation(s),
        "micro_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "optimizer": t.optim,
        "gradient_checkpointing": t.gradient_checkpointing,
        **same_named_training(t),
        "tf32": False,
        **dict.fromkeys(AXOLOTL_LORA_KERNELS, False),
        "output_dir": f"./outputs/{p.study}-trial{p.trial}",
    }
    comments = _comments(s, entry_comments)
    lines = header(s, "#", dataset_given=bool(entry)) + [f"# {measured_peak_line('axolotl')}", f"# {AXOLOTL_TELEMETRY}"]
    if data and data.rows is None:
        lines.append(f"# {data.missing_note()}")
    return yaml_text(lines, out, comments)


#: The axolotl file's line on axolotl's telemetry: on by default (opt-out), read in axolotl 0.21.0's
#: ``axolotl/telemetry/manager.py`` (``TelemetryManager._check_telemetry_enabled``); this project's own runs of axolotl
#: (tests/export/test_export_tools.py, benchmarks/memory/export_peak.py) set the variable.
AXOLOTL_TELEMETRY = (
    "axolotl sends usage telemetry (PostHog) unless its run starts with AXOLOTL_DO_NOT_TRACK=1 (or DO_NOT_TRACK=1): "
    "`AXOLOTL_DO_NOT_TRACK=1 axolotl train <this file>` where the run must not report to it "
    "(https://axolotl-ai-cloud.github.io/axolotl/docs/telemetry.html)."
)


def _comments(s: ExportSettings, entry_comments: dict[str, str]) -> dict[str, str]:
    """The comment on each key of :func:`render_axolotl`'s config that says what it keeps of the trial, or why a
    default of axolotl's is overridden; ``entry_comments``: those of the dataset entry."""
    comments: dict[str, str] = {
        **entry_comments,
        "bnb_config_kwargs": "axolotl ties bnb_4bit_compute_dtype to bf16/fp16; this entry sets the trial's value "
        "explicitly",
        "sequence_len": "sweeper's max_seq_length",
        "excess_length_strategy": "longer rows are cut to sequence_len, as the trial cut them (axolotl's default, "
        "drop, would leave them out)",
        **_collation_comments(s),
        "micro_batch_size": "per_device_train_batch_size",
        "tf32": "the trial ran float32 matmuls in full float32 (PyTorch's default); axolotl's default, auto, turns "
        "TF32 on for Ampere and newer GPUs",
        AXOLOTL_LORA_KERNELS[0]: "the trial ran peft's own LoRA layers; axolotl turns its fused LoRA kernels on by "
        "default for QLoRA, whose memory and (with lora_dropout) numerics are not what the sweep measured (axolotl "
        "0.21 still logs 'Auto-enabling LoRA kernel optimizations'; its validated config keeps these false)",
    }
    if not s.training.bf16 and not s.training.fp16:
        comments["bf16"] = "the trial computed in float32: no mixed precision (axolotl's default, auto, would use bf16)"
    else:  # axolotl 0.21 loaders/model.py: should_convert_embedding_dtypes is true with an adapter, no FSDP
        dtype = s.quantization.bnb_4bit_compute_dtype
        comments["adapter"] = (
            "axolotl converts embed_tokens, lm_head and the norms back to the compute dtype after preparing the "
            f"4-bit model, where the trial kept them in float32: this run holds them in {dtype}, 2 bytes less a "
            "weight on the card (about 2 GiB for Llama-3-8B's untied 128k vocabulary), with other numerics; no "
            "axolotl key keeps them in float32 without FSDP (its fp32_norms requires FSDP)"
        )
    return comments


def _collation(s: ExportSettings) -> dict[str, object]:
    """axolotl 0.21's keys of the trial's collation. Padded: ``sample_packing: false`` and ``pad_to_sequence_len:
    false`` (each micro-batch padded to its longest row; left unset, axolotl pads to a multiple of 64). Packed:
    ``sample_packing: true`` (its multipack: whole samples a row, position ids restarting at each) with
    ``pad_to_sequence_len: true`` (axolotl's recommendation with packing) and the trial's ``attn_implementation``:
    axolotl keeps packed samples apart only with an attention it knows handles packed rows (flash attention, sdpa,
    eager: it then drops the padding mask and the position ids mark the samples); left unset, it keeps the mask and
    warns that samples attend across each other."""
    c = s.collation
    if not c.packing:
        return {"sample_packing": False, "pad_to_sequence_len": False}
    return {"sample_packing": True, "pad_to_sequence_len": True, "attn_implementation": c.attn_implementation}


def _collation_comments(s: ExportSettings) -> dict[str, str]:
    """The comments of :func:`_collation`'s keys."""
    if not s.collation.packing:
        return {
            "sample_packing": "one sample a row, as in the trial",
            "pad_to_sequence_len": "each micro-batch padded to its longest row, as in the trial (left unset, axolotl "
            "pads to a multiple of 64)",
        }
    return {
        "sample_packing": "samples packed into rows of at most sequence_len tokens, position ids restarting at each "
        "sample, as in the trial",
        "pad_to_sequence_len": "axolotl's recommendation with sample_packing (it pads a packed row to sequence_len "
        "rounded up to a multiple of 64)",
        "attn_implementation": "the trial's attention, which keeps packed samples apart (without it axolotl lets "
        "them attend across each other)",
    }


def _cannot_express(trial: StoredTrial) -> str | None:
    """A ``lora_alpha`` that is not a whole number (``lora_alpha_ratio * r`` can be): axolotl 0.21's schema types it
    as an int and rejects a fractional one."""
    alpha = trial.lora_alpha
    if alpha is not None and not float(alpha).is_integer():
        return (
            f"its lora_alpha {alpha} (lora_alpha_ratio * r) is not a whole number, which axolotl cannot express (its "
            "lora_alpha is an integer)"
        )
    return None


def _files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The YAML and, with ``data``, the trial's rows beside it."""
    return {".yaml": render_axolotl(s, data), **(data.rows_file() if data else {})}


AXOLOTL = ExportFormat(
    name="axolotl",
    suffix=".yaml",
    help="an axolotl config (.yaml) and the trial's rows",
    render=_files,
    limit=Limit(
        why=_cannot_express,
        every="every one has a fractional lora_alpha, which axolotl cannot express",
        fix="run trials whose lora_alpha_ratio * r is a whole number",
    ),
    rows=True,
)
