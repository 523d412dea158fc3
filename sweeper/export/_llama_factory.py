"""The ``llama-factory`` export: a LLaMA-Factory training config (``finetuning_type: lora``, ``quantization_bit:
4``), in the keys LLaMA-Factory 0.9.5's parser reads."""

from __future__ import annotations

from sweeper.errors import StudyError
from sweeper.export._dataset import LLAMA_FACTORY_INFO, ExportData, llama_factory_dataset
from sweeper.export._format import ExportFormat, Limit
from sweeper.export._header import header
from sweeper.export._peaks import measured_peak_line
from sweeper.export._settings import ExportSettings
from sweeper.export._yaml import same_named_training, yaml_text
from sweeper.study import StoredTrial

#: What LLaMA-Factory computes a 4-bit model in: it has no key for the compute dtype and derives it from ``bf16`` /
#: ``fp16`` (LLaMA-Factory 0.9.5, ``hparams/parser.py``), or with neither from the GPU and the checkpoint's dtype
#: (``extras/misc.py: infer_optim_dtype``).
LLAMA_FACTORY_DTYPES = (
    "LLaMA-Factory has no key for the 4-bit compute dtype: bf16: true computes in bfloat16 (a GPU with bfloat16 "
    "support, Ampere or newer), fp16: true in float16; with neither it picks bfloat16 on a GPU with bfloat16 support "
    "when the checkpoint is bfloat16 or names no dtype, float16 on other GPUs and for a float16 or float32 checkpoint "
    "(a local float16 conversion included), float32 only without a GPU"
)


#: What LLaMA-Factory 0.9.5 holds the weights outside the 4-bit layers in (``model/loader.py``: ``torch_dtype:
#: auto``; no call of peft's ``prepare_model_for_kbit_training``, which the trial's recipe makes), read and run
#: (``benchmarks/memory/export_peak.py``: the embeddings and norms of a float16 checkpoint stayed float16).
LLAMA_FACTORY_FROZEN = (
    "LLaMA-Factory keeps the embeddings and lm_head in the checkpoint's dtype (it does not call peft's "
    "prepare_model_for_kbit_training, which upcast them to float32 in the trial): with a 16-bit checkpoint it holds "
    "them in half the trial's bytes (Llama-3-8B's untied 128k vocabulary: about 2 GiB less on the card); "
    "upcast_layernorm below keeps the norms in float32 as the trial had them; no key upcasts the embeddings or "
    "lm_head (the logits reach the loss in float32 either way: transformers' loss upcasts them)"
)


def render_llama_factory(s: ExportSettings, data: ExportData | None = None) -> tuple[str, str]:
    """A LLaMA-Factory training config (``finetuning_type: lora``, ``quantization_bit: 4``). LLaMA-Factory derives
    the 4-bit compute dtype from ``bf16``/``fp16`` and has no key for it (see :data:`LLAMA_FACTORY_DTYPES`): the
    comment states what it computes in. A float32 trial cannot be expressed (:func:`sweeper.export.inexpressible`).
    The trial's collation: ``packing: false``, or ``packing: true`` with ``neat_packing: true`` (:func:`_collation`).
    With ``data``, the ``dataset``/``dataset_dir``/``template`` keys of the trial's rows
    (:func:`sweeper.export._dataset.llama_factory_dataset`), or a comment saying why they could not be read.

    Returns:
        The YAML, and the ``dataset_info.json`` registering the rows (``""`` when there is none to write).

    Raises:
        StudyError: The trial computed in float32.
    """
    t, q, lora, p = s.training, s.quantization, s.lora, s.provenance
    dtype = q.bnb_4bit_compute_dtype
    if dtype == "float32":
        raise StudyError(
            f"{p.study}: --format llama-factory: trial {p.trial} computed in float32, "
            "which LLaMA-Factory cannot express; export it with --format hf, trl or axolotl"
        )
    name = f"{p.study}-trial{p.trial}"
    entry, entry_comments, info = (
        llama_factory_dataset(data.rows, data.folder, name) if data and data.rows else ({}, {}, "")
    )
    out = {
        "model_name_or_path": s.model,
        "stage": "sft",
        "do_train": True,
        **entry,
        "finetuning_type": "lora",
        "quantization_bit": 4,
        "quantization_type": q.bnb_4bit_quant_type,
        "double_quantization": q.bnb_4bit_use_double_quant,
        "lora_rank": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "lora_target": ",".join(lora.target_modules),
        "cutoff_len": s.max_seq_length,
        **_collation(s),
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "optim": t.optim,
        "disable_gradient_checkpointing": not t.gradient_checkpointing,
        "upcast_layernorm": True,
        **same_named_training(t),
        "output_dir": f"outputs/{p.study}-trial{p.trial}",
    }
    comments = {**entry_comments, **_comments(s)}
    lines = header(s, "#", dataset_given=bool(entry))
    lines += [f"# {line}" for line in (LLAMA_FACTORY_DTYPES, LLAMA_FACTORY_FROZEN, measured_peak_line("llama-factory"))]
    if data and data.rows is None:
        lines.append(f"# {data.missing_note()}")
    return yaml_text(lines, out, comments), info


def _comments(s: ExportSettings) -> dict[str, str]:
    """The comments of :func:`render_llama_factory`'s keys but the dataset's: what LLaMA-Factory does with each that
    the trial did otherwise, and the compute dtype it derives from ``bf16``/``fp16``."""
    dtype = s.quantization.bnb_4bit_compute_dtype
    effective = (
        "bfloat16, as the trial (needs a GPU with bfloat16 support: Ampere or newer)"
        if dtype == "bfloat16"
        else "float16, as the trial, on any GPU and whatever the checkpoint's dtype"
    )
    return {
        "quantization_bit": "bitsandbytes: LLaMA-Factory's default quantization_method",
        "quantization_type": "bnb_4bit_quant_type",
        "double_quantization": "bnb_4bit_use_double_quant",
        "cutoff_len": "sweeper's max_seq_length. A longer row is fitted by cutting its prompt and its reply each "
        "in part (LLaMA-Factory's infer_seqlen), where the trial cut the row's end: such rows train other tokens than "
        "in the trial ('sweep doctor' lists them as truncated)",
        "bf16" if dtype == "bfloat16" else "fp16": f"LLaMA-Factory computes the 4-bit layers in {effective}",
        "upcast_layernorm": "the norms in float32, as the trial held them (LLaMA-Factory's own advice for quantized "
        "training; left out, they stay in the checkpoint's dtype)",
        **_collation_comments(s),
    }


def _collation(s: ExportSettings) -> dict[str, bool]:
    """LLaMA-Factory 0.9.5's keys of the trial's collation (its ``DataArguments``): ``packing: false`` (one sample a
    row, each micro-batch padded to its longest row), or ``packing: true`` with ``neat_packing: true`` (packing
    without cross-attention: position ids restart at each sample and a block-diagonal mask keeps the samples apart;
    plain ``packing`` lets them attend across each other)."""
    if not s.collation.packing:
        return {"packing": False}
    return {"packing": True, "neat_packing": True}


def _collation_comments(s: ExportSettings) -> dict[str, str]:
    """The comments of :func:`_collation`'s keys."""
    if not s.collation.packing:
        return {
            "packing": "one sample a row, each micro-batch padded to its longest row (LLaMA-Factory rounds it up to "
            "a multiple of 8), as in the trial"
        }
    return {
        "packing": "samples packed into rows of cutoff_len tokens, as in the trial (LLaMA-Factory fills a row with "
        "at most cutoff_len - 1 tokens)",
        "neat_packing": "position ids restart at each sample and no token attends across samples, as in the trial",
    }


def _cannot_express(trial: StoredTrial) -> str | None:
    """A float32 compute dtype: LLaMA-Factory has no key for it (see :data:`LLAMA_FACTORY_DTYPES`)."""
    if trial.config is not None and trial.config.bnb_4bit_compute_dtype == "float32":
        return (
            "it computed in float32, which LLaMA-Factory cannot express (it computes a 4-bit model in bfloat16 or "
            "float16 on a GPU)"
        )
    return None


def _files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The YAML and, with ``data``, the trial's rows and the ``dataset_info.json`` registering them beside it (none
    for text rows: LLaMA-Factory has no entry that trains them as the trial did)."""
    text, info = render_llama_factory(s, data)
    if not (data and info):
        return {".yaml": text}
    return {".yaml": text, **data.rows_file(), str(data.folder / LLAMA_FACTORY_INFO): info}


LLAMA_FACTORY = ExportFormat(
    name="llama-factory",
    suffix=".yaml",
    help="a LLaMA-Factory config (.yaml) and the trial's rows",
    render=_files,
    limit=Limit(
        why=_cannot_express,
        every="every one computed in float32, which LLaMA-Factory cannot express",
        fix="run trials with bnb_4bit_compute_dtype bfloat16 or float16",
    ),
    rows=True,
)
