"""The ``.py`` exports: ``hf``, a file building transformers' and peft's config objects, and ``trl``, the same with
TRL's ``SFTConfig`` and a ``build_trainer`` whose row reader is :mod:`sweeper.export.trl_rows`, copied in as text.
Both files stand alone: they import torch, transformers, peft and TRL, never sweeper. A trial that packed samples
into rows is exported as ``trl`` (``packing``), never as ``hf`` (:data:`HF_PACKING`)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from sweeper.errors import StudyError
from sweeper.export._dataset import ExportData
from sweeper.export._format import ExportFormat, Limit
from sweeper.export._header import header
from sweeper.export._json import render_json
from sweeper.export._peaks import measured_peak_line
from sweeper.export._settings import ExportSettings
from sweeper.study import StoredTrial

#: ``TrainingArguments`` keys the ``.py`` exports write by another name: transformers 5.23 renamed
#: ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name warns there and goes in v6), while the
#: production stacks pin older releases (axolotl 0.21: 5.20.1, LLaMA-Factory 0.9.5: at most 5.6.0). The file asks
#: the installed transformers which name it has.
_CHECKPOINTING_LINES = [
    "# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name warns there and is",
    "# removed in v6); older releases, such as axolotl's 5.20 and LLaMA-Factory's 5.6, know only the old name.",
    'CHECKPOINTING = "activation_checkpointing"',
    "if CHECKPOINTING not in {0}.__dataclass_fields__:",
    '    CHECKPOINTING = "gradient_checkpointing"',
]

#: Why the ``hf`` export cannot express a trial that packed samples (``packing: true``): a transformers ``Trainer``
#: has no collator that packs samples into rows; ``DataCollatorWithFlattening`` (transformers 5) restarts the position
#: ids and masks the first label of each sample, but flattens a whole micro-batch into one row, so that a micro-batch
#: holds ``per_device_train_batch_size`` samples instead of that many packed rows of ``max_seq_length`` tokens: not
#: the batches whose memory and stability the trial measured.
HF_PACKING = (
    "it packed samples into rows (packing: true), which the hf export cannot express (a transformers Trainer has no "
    "collator that packs samples into rows: DataCollatorWithFlattening flattens each micro-batch into one row)"
)

#: The ``hf`` file's header line on packing (it writes the padded collation only).
_HF_PACKING_LINE = (
    "# hf pads only: a trial that packed samples is exported with --format trl, axolotl or llama-factory "
    "(transformers' DataCollatorWithFlattening flattens each micro-batch into one row, not into packed rows)."
)


def trl_padding_free_line(s: ExportSettings) -> str | None:
    """The ``trl`` file's warning where TRL's packing cannot peak as the trial did, else None.

    With ``packing_strategy="bfd"`` TRL trains padding-free (``SFTTrainer`` sets ``padding_free`` itself, TRL 1.x
    ``sft_trainer.py``): its collator flattens a micro-batch's ``B`` packed rows into one row of up to ``B x L``
    tokens (``L`` = ``max_seq_length``). Flash attention takes that row sample by sample; on ``sdpa`` and ``eager``
    transformers builds the block-diagonal mask over the whole row, ``(B x L)^2`` elements where the trial's
    ``B`` rows held ``B x L^2`` (``B`` times as many; ``eager`` also keeps its attention scores that size per
    head), so above batch 1 the trial's peak does not carry over (issue 57).
    """
    c, b, seq = s.collation, s.training.per_device_train_batch_size, s.max_seq_length
    if not c.packing or c.attn_implementation == "flash_attention_2" or b == 1:
        return None
    eager = " (eager also keeps its attention scores that size, per head)" if c.attn_implementation == "eager" else ""
    return (
        f"TRL packs padding-free: each micro-batch of {b} packed rows is one row of up to {b * seq} tokens, and on "
        f"{c.attn_implementation} its attention mask holds (batch x length)^2 = {(b * seq) ** 2:,} elements where the "
        f"trial's {b} rows held {b * seq * seq:,}{eager}: to stay within the measured peak, train with "
        f"attn_implementation flash_attention_2 on a GPU, or per_device_train_batch_size 1 with "
        f"gradient_accumulation_steps {b} times this file's."
    )


def trl_fully_masked_line(max_seq_length: int) -> str:
    """The ``trl`` file's line on the rows TRL leaves out: ``SFTTrainer`` (TRL 1.14 and 1.16, ``_prepare_dataset``)
    drops each example that truncation at ``max_length`` leaves without a supervised token, which the trial kept
    (it trained them at no loss, and a step made only of them is a NaN the data audit reports)."""
    return (
        f"TRL drops the rows that truncation at max_length {max_seq_length} leaves without a supervised token (a "
        "reply cut away), which the trial kept: where the sweep's data audit counted such samples at this "
        "max_seq_length ('sweep doctor' lists them), TRL trains fewer rows, and none of its steps is the NaN the "
        "trial's data could make."
    )


#: The ``hf`` file's ``make_data_collator`` (the trial's padded collation, as transformers builds it) and
#: ``adapt_model`` (the trial's preparation of the 4-bit model and its LoRA).
_HF_COLLATOR = [
    "",
    "",
    "def make_data_collator(tokenizer):",
    '    """The trial\'s collation: one sample a row, each micro-batch padded (right) to its longest row, the padding',
    '    unsupervised (label -100); give it to Trainer(data_collator=...)."""',
    "    if tokenizer.pad_token is None:",
    "        tokenizer.pad_token = tokenizer.eos_token  # as the trial did",
    '    tokenizer.padding_side = "right"  # as the trial padded',
    '    return DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)',
    "",
    "",
    "def adapt_model(model):",
    '    """The loaded 4-bit model prepared and adapted as the trial did (the QLoRA recipe): the weights outside the',
    "    4-bit layers (embeddings, norms, lm_head) in float32, no KV cache, checkpointing without reentrancy, and the",
    '    LoRA of lora_config; give the result to Trainer(model=...)."""',
    "    from peft import get_peft_model, prepare_model_for_kbit_training",
    "",
    "    model.config.use_cache = False",
    "    model = prepare_model_for_kbit_training(",
    "        model,",
    "        use_gradient_checkpointing=bool(getattr(training_args, CHECKPOINTING)),",
    '        gradient_checkpointing_kwargs={"use_reentrant": False},',
    "    )",
    "    return get_peft_model(model, lora_config)",
    "",
]

#: The line of :mod:`sweeper.export.trl_rows` after which the file is the ``trl`` script's text.
TRL_ROWS_START = "# fmt: off\n"

#: How the ``trl`` file ends: how to load the model and train.
_TRL_USAGE = [
    "",
    "",
    "# Train with: tokenizer = AutoTokenizer.from_pretrained(MODEL_NAME); model = AutoModelForCausalLM."
    "from_pretrained(",
    "#     MODEL_NAME, quantization_config=bnb_config, dtype=bnb_config.bnb_4bit_compute_dtype)",
    "# build_trainer(model, tokenizer, rows).train()  # rows: your dataset, e.g. datasets.load_dataset(...)",
]

#: How the ``hf`` file ends: how to load the model and tokenize.
_HF_USAGE = [
    "",
    "# Load the model with: AutoModelForCausalLM.from_pretrained(MODEL_NAME, "
    "quantization_config=bnb_config, dtype=bnb_config.bnb_4bit_compute_dtype)",
    "# Tokenize as the trial did: one sample a row (no packing), cut to MAX_SEQ_LENGTH tokens at its end; train with",
    "# Trainer(model=adapt_model(model), args=training_args, train_dataset=rows,",
    "#         data_collator=make_data_collator(tokenizer)).",
]


@cache
def trl_rows_source() -> str:
    """The text of :mod:`sweeper.export.trl_rows` the ``trl`` file carries: all of it after its ``# fmt: off`` line
    (read as package data, so that an installed sweeper has it too)."""
    text = resources.files("sweeper.export").joinpath("trl_rows.py").read_text(encoding="utf-8")
    _, start, source = text.partition("\n" + TRL_ROWS_START)
    if not start:
        raise RuntimeError(f"sweeper/export/trl_rows.py has no {TRL_ROWS_START.strip()!r} line")
    return source


def _py_value(value: Any) -> str:
    """A value as Python source."""
    return repr(value)


def render_hf(s: ExportSettings, *, trl: bool = False) -> str:
    """A Python file building ``BitsAndBytesConfig``, ``LoraConfig`` and ``TrainingArguments`` from the settings
    (``hf``), or TRL's ``SFTConfig`` and a ``build_trainer(model, tokenizer, rows)`` that builds the ``SFTTrainer``
    (``trl``); importing it builds the config objects, nothing is loaded or trained.

    It runs on every transformers 5 release (the checkpointing key's name is asked of the installed one). The
    ``trl`` file chooses at run time how TRL supervises what the trial supervised: ``assistant_only_loss`` where the
    tokenizer's chat template lets TRL mask assistant turns, else each reply as a prompt/completion row
    (``completion_only_loss``), the template's end-of-turn token included either way. Both carry the trial's
    collation: the ``hf`` file's ``make_data_collator`` pads each micro-batch to its longest row; the ``trl`` file sets
    ``packing`` (with ``packing_strategy="bfd"`` and ``padding_free`` for a trial that packed samples).

    Raises:
        StudyError: ``hf`` of a trial that packed samples (:data:`HF_PACKING`).
    """
    if not trl and s.collation.packing:
        p = s.provenance
        raise StudyError(f"{p.study}: --format hf: trial {p.trial}: {HF_PACKING}; export it with --format trl")
    args_class = "SFTConfig" if trl else "TrainingArguments"
    lines = _preamble(s, trl) + _configs(s, args_class)
    if trl:
        lines += _sft_config(s) + trl_rows_source().rstrip("\n").split("\n") + _TRL_USAGE
    else:
        lines += _training_arguments(s) + _HF_COLLATOR + _HF_USAGE
    return "\n".join(lines) + "\n"


def _preamble(s: ExportSettings, trl: bool) -> list[str]:
    """The file's docstring, header comment, imports and constants (the ``trl`` file's chat template among them)."""
    from sweeper.data import DEFAULT_CHAT_TEMPLATE

    lines = ['"""QLoRA settings chosen with sweeper."""', "", *header(s, "#", sets_environment=True, trl=trl)]
    lines.append(f"# {measured_peak_line('trl' if trl else 'hf')}")
    if not trl:
        lines.append(_HF_PACKING_LINE)
    else:
        lines.append(f"# {trl_fully_masked_line(s.max_seq_length)}")
        if (flattened := trl_padding_free_line(s)) is not None:
            lines.append(f"# {flattened}")
    lines += [
        "",
        *_environment(s),
        "import torch",
        "from peft import LoraConfig" + (", prepare_model_for_kbit_training" if trl else ""),
        "from transformers import BitsAndBytesConfig" + ("" if trl else ", DataCollatorForSeq2Seq, TrainingArguments"),
    ]
    if trl:
        lines.append("from trl import SFTConfig, SFTTrainer")
    lines += [
        "",
        f"MODEL_NAME = {s.model!r}",
        f"MAX_SEQ_LENGTH = {s.max_seq_length}",
    ]
    if trl:
        lines += [
            "# The chat template the trials applied when the tokenizer has none (build_trainer sets it then).",
            f"TRIAL_CHAT_TEMPLATE = {DEFAULT_CHAT_TEMPLATE!r}",
        ]
    return lines


def _environment(s: ExportSettings) -> list[str]:
    """The lines that set the run's environment (:attr:`ExportSettings.environment`) before torch is imported, with a
    warning where the user's environment said otherwise; none when it sets nothing."""
    if not s.environment:
        return []
    from sweeper.devices import ALLOC_CONF_VAR, CUDA_ALLOC_CONF_VAR

    lines = ["import os", "import warnings", "", "# As the trial ran; the CUDA allocator reads it when torch starts."]
    for name, value in s.environment.items():
        lines += [
            f"if os.environ.get({name!r}, {value!r}) != {value!r}:",
            f'    warnings.warn(f"{name}={{os.environ[{name!r}]}} replaced by the trial\'s {value}", stacklevel=1)',
            f"os.environ[{name!r}] = {value!r}",
        ]
        if name == CUDA_ALLOC_CONF_VAR:  # torch's newer name, which some versions read first: the same value there
            lines += [
                f"if os.environ.get({ALLOC_CONF_VAR!r}, {value!r}) != {value!r}:",
                f"    warnings.warn(f\"{ALLOC_CONF_VAR}={{os.environ[{ALLOC_CONF_VAR!r}]}} replaced by the trial's "
                f'{value}", stacklevel=1)',
                f"    os.environ[{ALLOC_CONF_VAR!r}] = {value!r}",
            ]
    return [*lines, ""]


def _configs(s: ExportSettings, args_class: str) -> list[str]:
    """The checkpointing key's name, ``bnb_config`` and ``lora_config``."""
    dtype = s.quantization.bnb_4bit_compute_dtype
    lines = ["", *[line.format(args_class) for line in _CHECKPOINTING_LINES], "", "bnb_config = BitsAndBytesConfig("]
    lines += [f"    {k}={_py_value(v)}," for k, v in s.quantization.to_dict().items() if k != "bnb_4bit_compute_dtype"]
    lines += [f"    bnb_4bit_compute_dtype=torch.{dtype},", ")", "", "lora_config = LoraConfig("]
    lines += [f"    {k}={_py_value(v)}," for k, v in s.lora.to_dict().items()]
    return lines + [")", ""]


def _training_keys(s: ExportSettings, indent: str) -> list[str]:
    """The training arguments but the checkpointing key (whose name the file asks of transformers), one a line."""
    out_dir = f"outputs/{s.provenance.study}-trial{s.provenance.trial}"
    lines = [f"{indent}output_dir={out_dir!r},"]
    lines += [f"{indent}{k}={_py_value(v)}," for k, v in s.training.to_dict().items() if k != "gradient_checkpointing"]
    lines.append(f"{indent}use_cpu=not torch.cuda.is_available(),  # so that the file also loads without a GPU")
    return lines


def _training_arguments(s: ExportSettings) -> list[str]:
    """The ``hf`` file's ``training_args = TrainingArguments(...)``."""
    return [
        "training_args = TrainingArguments(",
        *_training_keys(s, "    "),
        f"    **{{CHECKPOINTING: {_py_value(s.training.gradient_checkpointing)}}},",
        ")",
    ]


def _sft_config(s: ExportSettings) -> list[str]:
    """The ``trl`` file's ``make_sft_config(**overrides)`` and ``training_args = make_sft_config()``."""
    indent = "        "
    return [
        "",
        "def make_sft_config(**overrides):",
        '    """training_args with some keys replaced."""',
        "    settings = dict(",
        *_training_keys(s, indent),
        f"{indent}max_length=MAX_SEQ_LENGTH,  # TRL's name for max_seq_length",
        f'{indent}truncation_mode="keep_start",  # longer rows are cut at the end, as the trial cut them',
        f"{indent}loss_type=\"nll\",  # TRL 1.14's loss over the full logits, the trial's; from TRL 1.16 it is tiled",
        *_trl_collation(s, indent),
        "    )",
        f"    settings[CHECKPOINTING] = {_py_value(s.training.gradient_checkpointing)}",
        "    return SFTConfig(**{**settings, **overrides})",
        "",
        "",
        "training_args = make_sft_config()",
    ]


def _trl_collation(s: ExportSettings, indent: str) -> list[str]:
    """The ``SFTConfig`` keys of the trial's collation: ``packing=False`` (TRL pads each micro-batch to its longest
    row), or ``packing=True`` with ``packing_strategy="bfd"`` (whole samples a row, each cut at ``max_length``) and
    ``padding_free=True`` (position ids restart at each sample, which keeps the samples apart; TRL then flattens a
    micro-batch's packed rows into one row, where the trial pads them to the longest)."""
    if not s.collation.packing:
        return [
            f"{indent}packing=False,  # one sample a row, each micro-batch padded to its longest row, as in the trial"
        ]
    return [
        f"{indent}packing=True,  # samples packed into rows of at most max_length tokens, as in the trial",
        f'{indent}packing_strategy="bfd",  # whole samples a row, each cut at max_length (rows filled best-fit)',
        f"{indent}padding_free=True,  # position ids restart at each sample: no token attends across samples "
        "(TRL flattens a micro-batch's packed rows into one row, without their padding)",
    ]


def _hf_cannot_express(trial: StoredTrial) -> str | None:
    """A trial that packed samples (:data:`HF_PACKING`)."""
    return HF_PACKING if trial.config is not None and trial.config.packing else None


def _hf_files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The ``.py`` file and the settings as JSON beside it."""
    return {".py": render_hf(s), ".json": render_json(s)}


def _trl_files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The ``.py`` file."""
    return {".py": render_hf(s, trl=True)}


HF = ExportFormat(
    name="hf",
    suffix=".py",
    help="transformers and peft configs (.py) and the settings (.json)",
    render=_hf_files,
    limit=Limit(
        why=_hf_cannot_express,
        every="every one packed samples into rows, which the hf export cannot express",
        fix="run trials with packing: false",
    ),
)
TRL = ExportFormat(
    name="trl",
    suffix=".py",
    help="TRL's SFTConfig and SFTTrainer (.py)",
    render=_trl_files,
)
