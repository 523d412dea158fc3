"""``sweep init --from FILE``: a space from the user's own training config (issue 67), read by
:mod:`sweeper.export.production` (the reader the policy guard carries), and the table of what became of each of its
keys.

The space keeps the user's run as the fixed part (model, data, learning rate, warmup, weight decay, clipping,
optimizer, checkpointing, the effective batch, target modules spelled out, dropout, packing, attention) and searches
the card's settings around the user's own values, the user's value first (what ``sweep trial`` runs when nothing is
set): ``r``, ``lora_alpha / r``, compute dtype, double quant, quant type, batch and ``max_seq_length``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sweeper.export.production import ALL_LINEAR, INFERRED_PRECISION, KeyLine, Reading
from sweeper.space import OPTIMIZERS, TrialConfig, name_problem

#: axolotl's dataset ``type`` and TRL/LLaMA-Factory's formatting, as sweeper's ``dataset.format``.
_DATA_FORMATS = {
    "alpaca": "alpaca",
    "chat_template": "chat",
    "sharegpt": "sharegpt",
    "completion": "text",
    "pretrain": "text",
    "input_output": "prompt_completion",
}

#: The compute dtypes a GPU search tries, the user's first.
_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class SpaceFrom:
    """A space made from a production config.

    Attributes:
        text: The space file's text (YAML with comments).
        table: Each key of the file and what became of it: ``(key, value, what, where)``, ``what`` one of
            ``carried``, ``translated``, ``tool default``, ``not carried``, ``unread``; ``where`` the space key it
            went to (with the translation), or the reason it did not.
        warnings: What the user must know before running it (a memory-moving key not carried, a model or data that is
            not local, the card's size to set).
    """

    text: str
    table: list[tuple[str, str, str, str]]
    warnings: list[str]


def _halves(value: int, low: int) -> list[int]:
    """``[value, value / 2, value * 2]`` without repeats or values below ``low``: the user's first."""
    out = [value]
    for v in (value // 2, value * 2):
        if v >= low and v not in out:
            out.append(v)
    return out


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 6)


def _study_name(path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.rsplit("/", 1)[-1].rsplit(".", 1)[0]).strip("-.") or "sweep"
    return stem if name_problem(stem) is None else "sweep"


@dataclass
class _Notes:
    """What :func:`space_from` says as it reads the file: each key's place in the space (``where``, for the table),
    the warnings, and the comments the space's YAML carries, by key."""

    where: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)


def _pick(s: dict[str, Any], setting: str, fallback: Any) -> Any:
    """The file's value of ``setting``, ``fallback`` where it sets none."""
    value = s.get(setting)
    return fallback if value is None else value


def space_from(reading: Reading) -> SpaceFrom:
    """The space of ``reading`` (see the module's docstring) and its table: the searched part around the file's
    values (:func:`_search`), the fixed part of its run (:func:`_training`), its model (:func:`_model`) and its data
    (:func:`_dataset`).

    Raises:
        ValueError: The file trains no LoRA adapter of a 4-bit or 16-bit model sweeper can search (none of ``r`` and
            ``lora_alpha`` and no model): the message names what is missing.
    """
    if not reading.settings.get("model"):
        raise ValueError(f"{reading.path}: names no model ({reading.key('model')}); a space needs one")
    notes = _Notes()
    search, batch = _search(reading, notes)
    training = _training(reading, notes, batch)
    model = _model(reading, notes, search, batch)
    dataset = _dataset(reading, notes)
    for key, why in {**reading.not_measured, **reading.noted}.items():
        notes.warnings.append(f"{key}: not carried: {why}")
    raw = {
        "study": {"name": _study_name(reading.path), "n_trials": 24, "baseline": True},
        "model": model,
        "dataset": dataset,
        "training": training,
        "search": search,
    }
    text = _yaml(reading, raw, notes.comments)
    return SpaceFrom(text=text, table=_table(reading, notes.where), warnings=notes.warnings)


def _search(reading: Reading, notes: _Notes) -> tuple[dict[str, list[Any]], int]:
    """The searched part, around the file's values (each list starts at the file's value), and the file's
    ``per_device_train_batch_size``.

    Raises:
        ValueError: ``r``, the batch or ``max_seq_length`` is below its least value.
    """
    s, defaults = reading.settings, TrialConfig()
    r = int(_pick(s, "r", defaults.r))
    for setting, low in (("r", 1), ("per_device_train_batch_size", 1), ("max_seq_length", 8)):
        value = s.get(setting)
        if isinstance(value, int) and value < low:
            raise ValueError(f"{reading.path}: {reading.key(setting)}: {value} is below {low}; fix the file's value")
    alpha = _pick(s, "lora_alpha", 2 * r)
    ratio = _number(float(alpha) / r)
    dtype = _pick(s, "bnb_4bit_compute_dtype", "bfloat16")
    if dtype == INFERRED_PRECISION:
        dtype = "bfloat16"
        notes.warnings.append(
            f"{reading.path}: sets neither bf16 nor fp16: LLaMA-Factory then picks bfloat16 or float16 from the GPU "
            "and the checkpoint; the space searches bfloat16 first (set bf16: true in the file to run what was "
            "measured)"
        )
    if dtype not in _DTYPES:
        notes.warnings.append(
            f"{reading.path}: compute dtype {dtype!r} is not one sweeper runs; searched from bfloat16"
        )
        dtype = "bfloat16"
    double_quant = bool(_pick(s, "bnb_4bit_use_double_quant", True))
    quant_type = _pick(s, "bnb_4bit_quant_type", "nf4")
    quant_type = quant_type if quant_type in ("nf4", "fp4") else "nf4"
    batch = int(_pick(s, "per_device_train_batch_size", 1))
    length = int(_pick(s, "max_seq_length", defaults.max_seq_length))
    if s.get("max_seq_length") is None and "max_seq_length" in reading.keys:
        notes.warnings.append(
            f"{reading.key('max_seq_length')}: null truncates nothing (rows as long as the data's): the space "
            f"searches max_seq_length {length}; set it to your longest rows (sweep doctor shows their lengths)"
        )
    search: dict[str, list[Any]] = {
        "r": _halves(r, 1),
        "lora_alpha_ratio": [ratio, *[_number(ratio * f) for f in (0.5, 2) if _number(ratio * f) != ratio]],
        "bnb_4bit_compute_dtype": [dtype, *[d for d in _DTYPES if d != dtype]],
        "bnb_4bit_use_double_quant": [double_quant, not double_quant],
        "bnb_4bit_quant_type": [quant_type, "fp4" if quant_type == "nf4" else "nf4"],
        "per_device_train_batch_size": _halves(batch, 1),
        "max_seq_length": [length, *([length // 2] if length // 2 >= 8 else [])],
    }
    for setting, space_key in (("r", "r"), ("lora_alpha", "lora_alpha_ratio"), ("bnb_4bit_compute_dtype", "")):
        notes.where[setting] = f"search.{space_key or setting}"
    notes.where["lora_alpha"] = f"search.lora_alpha_ratio ({alpha} / {r} = {ratio})"
    for setting in ("bnb_4bit_use_double_quant", "bnb_4bit_quant_type", "per_device_train_batch_size",
                    "max_seq_length"):  # fmt: skip
        notes.where[setting] = f"search.{setting}"
    notes.where["mixed_precision"] = "search.bnb_4bit_compute_dtype (bf16/fp16 follow it)"
    return search, batch


def _training(reading: Reading, notes: _Notes, batch: int) -> dict[str, Any]:
    """The fixed part: the file's run (rate, warmup, decay, clipping, checkpointing, dropout, packing, seed, the
    optimizer and targets sweeper runs, the effective batch of ``batch`` x accumulation) and ``memory_limit_gib:
    auto``."""
    s, defaults = reading.settings, TrialConfig()
    training: dict[str, Any] = {}
    for setting in ("learning_rate", "warmup_steps", "weight_decay", "max_grad_norm", "gradient_checkpointing",
                    "lora_dropout", "packing", "seed"):  # fmt: skip
        if s.get(setting) is not None:
            training[setting] = s[setting]
            notes.where[setting] = f"training.{setting}"
    optim = s.get("optim")
    if optim in OPTIMIZERS:
        training["optim"] = optim
        notes.where["optim"] = "training.optim"
    elif optim is not None:
        notes.where["optim"] = f"not carried: {optim!r} is not an optimizer sweeper runs ({', '.join(OPTIMIZERS)})"
        notes.warnings.append(
            f"{reading.key('optim')} {optim!r}: not an optimizer sweeper runs; the space keeps its default "
            f"{defaults.optim} (optimizer state is part of the peak: the measured peak differs from the run's)"
        )
    targets = s.get("target_modules")
    if targets == "all-linear":
        training["target_modules"] = list(ALL_LINEAR)
        notes.comments["target_modules"] = (
            "all-linear spelled out: the decoder's linear layers of Llama/Mistral/Qwen/Gemma"
        )
        notes.where["target_modules"] = "training.target_modules (all-linear spelled out)"
    elif isinstance(targets, str) and targets.startswith("re:"):
        notes.where["target_modules"] = (
            "not carried: a pattern; list the module names it matches in training.target_modules"
        )
        notes.warnings.append(
            f"{reading.key('target_modules')} is a pattern ({targets[3:]}): write the module names it matches into "
            "training.target_modules (the space keeps q/k/v/o_proj, fewer adapters: a lower peak than the run's)"
        )
    elif targets:
        training["target_modules"] = list(targets)
        notes.where["target_modules"] = "training.target_modules"
    accumulation = int(_pick(s, "gradient_accumulation_steps", 1))
    training["target_effective_batch_size"] = batch * accumulation
    notes.comments["target_effective_batch_size"] = (
        f"the file's {reading.key('per_device_train_batch_size')} {batch} x "
        f"{reading.key('gradient_accumulation_steps')} {accumulation}: sweep export keeps it through "
        "gradient_accumulation_steps"
    )
    notes.where["gradient_accumulation_steps"] = (
        f"training.target_effective_batch_size ({batch} x {accumulation} = {batch * accumulation})"
    )
    training["memory_limit_gib"] = "auto"
    notes.comments["memory_limit_gib"] = "the card sweep runs on; your production card's GiB if it is smaller"
    if s.get("pad_to_max_length") and not s.get("packing"):
        notes.where["pad_to_max_length"] = (
            "not carried: trials pad each micro-batch to its longest row; every row padded to max_seq_length has "
            "a HIGHER peak than measured on shorter data"
        )
    return training


def _model(reading: Reading, notes: _Notes, search: dict[str, list[Any]], batch: int) -> dict[str, Any]:
    """The model part (its path and attention), how the file loads it; with packing on flash_attention_2, ``search``
    narrowed to batch 1."""
    s = reading.settings
    model: dict[str, Any] = {"name_or_path": str(s["model"])}
    attn = s.get("attn_implementation")
    if attn == "flash_attention_2" and s.get("packing") and search["per_device_train_batch_size"] != [1]:
        search["per_device_train_batch_size"] = [1]
        notes.warnings.append(
            f"{reading.key('per_device_train_batch_size')} {batch} with packing and flash_attention_2: transformers "
            "keeps packed samples apart only at batch 1, so the space searches batch 1 (the effective batch kept "
            f"through gradient_accumulation_steps); to search the file's batch, edit the space: model."
            f"attn_implementation: sdpa and search.per_device_train_batch_size: {_halves(batch, 1)}"
        )
    if attn in ("sdpa", "eager", "flash_attention_2"):
        model["attn_implementation"] = attn
        notes.where["attn_implementation"] = "model.attn_implementation"
    notes.where["model"] = "model.name_or_path"
    if s.get("load_in_4bit"):
        notes.where["load_in_4bit"] = "every trial loads the model in 4-bit"
    elif s.get("load_in_4bit") is None:
        notes.where["load_in_4bit"] = "the file does not say how the model loads; every trial loads it in 4-bit"
    else:
        notes.where["load_in_4bit"] = (
            "not carried: every trial loads the model in 4-bit; this file trains it in 16 or 8 bits (a HIGHER peak "
            "than measured)"
        )
        notes.warnings.append(f"{reading.path}: loads the model in 16 or 8 bits; every trial loads it in 4-bit (QLoRA)")
    notes.where["load_in_8bit"] = (
        notes.where["load_in_4bit"] if not s.get("load_in_8bit") else "not carried: 8-bit weights"
    )
    return model


def _dataset(reading: Reading, notes: _Notes) -> dict[str, Any]:
    """The dataset part: the file's data file and its format, or the built-in rows where it names none sweeper
    reads."""
    s = reading.settings
    dataset: dict[str, Any] = {}
    data = s.get("dataset")
    if data:
        dataset["path"] = str(data)
        notes.where["dataset"] = "dataset.path"
        kind = _dataset_type(reading)
        if kind:
            dataset["format"] = kind
    else:
        dataset["path"] = "builtin:pydoc-topics"
        notes.comments["dataset"] = "the file names no dataset sweeper reads: your rows' file here"
        notes.warnings.append(
            f"{reading.path}: names no dataset file; the space uses the built-in rows until you set one"
        )
    if reading.tool == "llama-factory" and data:
        notes.warnings.append(
            f"dataset {data!r} is a name in LLaMA-Factory's dataset_info.json: set dataset.path to its file"
        )
    return dataset


def _dataset_type(reading: Reading) -> str | None:
    """sweeper's ``dataset.format`` of the file's first dataset entry's ``type`` (axolotl), or None (auto)."""
    line = next((ln for ln in reading.lines if ln.setting == "dataset"), None)
    entry = line.value[0] if line is not None and isinstance(line.value, list) and line.value else None
    kind = entry.get("type") if isinstance(entry, dict) else None
    return _DATA_FORMATS.get(str(kind).split(".")[0]) if kind else None


def _table(reading: Reading, where: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """Each key of the file (then each tool default used), what became of it and where it went."""
    out = []

    def shown(v: Any) -> str:
        return repr(v) if not isinstance(v, list | dict) else f"{type(v).__name__} of {len(v)}"

    for line in reading.lines:
        status, to = _status(line, where)
        out.append((line.key, shown(line.value)[:40], status, to))
    return out


def _status(line: KeyLine, where: dict[str, str]) -> tuple[str, str]:
    """The table's ``what`` and ``where`` of one key."""
    if line.setting is None or line.status in ("unread", "not carried"):
        return line.status, line.note
    target = where.get(line.setting)
    if target is None:
        return "not carried", f"{line.setting}: no space key for it"
    if target.startswith("not carried"):
        return "not carried", target.removeprefix("not carried: ")
    status = "tool default" if line.status == "default" else line.status
    if status == "carried" and target.split(" ")[0].rsplit(".", 1)[-1] != line.key:
        status = "translated"
    how = f" ({line.note})" if line.note and line.status == "translated" else ""
    return status, target + how


def _yaml(reading: Reading, raw: dict[str, Any], comments: dict[str, str]) -> str:
    """The space's YAML, with a header saying where it came from and comments on the keys that need them."""
    import yaml

    lines = [
        f"# sweep init --from {reading.path} ({reading.tool}): the file's run as the fixed part, a search of the",
        "# card's settings around its own values (each list's first value is the file's: 'sweep trial' runs it).",
        "# The model and the dataset must be local or reachable ('sweep trial THIS --set model.name_or_path=... --set",
        "# dataset.path=...' tries others). study.baseline runs the file's own settings as the first trial.",
    ]

    def comment_of(section: str, key: str) -> str | None:
        if section == "study" and key == "baseline":
            return "the file's own settings (each list's first value) are the study's first trial"
        return comments.get(key) or (comments.get("dataset") if section == "dataset" and key == "path" else None)

    for section, body in raw.items():
        lines.append(f"{section}:")
        for key, value in body.items():
            comment = comment_of(section, key)
            if isinstance(value, list):
                text = f"{key}: " + yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            else:
                text = yaml.safe_dump({key: value}, default_flow_style=False, sort_keys=False, width=1000).rstrip("\n")
            lines.append(f"  {text}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines) + "\n"
