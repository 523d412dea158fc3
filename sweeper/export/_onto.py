"""``sweep export --onto FILE``: a trial's measured keys written back onto the user's own training config (issue 67):
the same file with only the keys whose value differs from what the trial measured changed, each under the file's own
key (or its tool's, for a key the file leaves at its default), comments, order and quoting kept (YAML through
ruamel.yaml's round trip), a header of what was measured on a YAML, and the diff.
"""

from __future__ import annotations

import difflib
import io
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.errors import StudyError
from sweeper.export._settings import ExportSettings, settings_of
from sweeper.export.production import (
    PRECISION_OF_DTYPE,
    ProductionConfigError,
    Reading,
    read_production,
    written,
)
from sweeper.notation import format_chance
from sweeper.study import StoredTrial, StudySnapshot

#: The first line of the header ``--onto`` writes at the top of a YAML (a later ``--onto`` replaces the block).
HEADER_MARK = "# sweeper --onto:"
#: Its second line.
HEADER_KEYS = "# Keys written from what it measured:"


@dataclass(frozen=True)
class Onto:
    """What ``--onto`` wrote.

    Attributes:
        path: The file written.
        backup: The original kept beside it (None when written elsewhere than the file read, or kept already).
        changed: The file's keys changed, ``{key: (before, after)}``; an empty dict when the file was as measured.
        diff: The unified diff of the file's text.
    """

    path: Path
    backup: Path | None
    changed: dict[str, tuple[Any, Any]]
    diff: str


def measured_settings(s: ExportSettings) -> dict[str, Any]:
    """The settings of :data:`sweeper.export.production.SETTINGS` the trial measured, as exported (the accumulation
    keeping ``target_effective_batch_size``), the learning rate at most the trial's safe rate (the largest whose
    chance of diverging within the study's horizon has its upper end at 5%) where one was measured."""
    t, q, lora = s.training, s.quantization, s.lora
    safe = s.envelope.safe_learning_rate if s.envelope is not None else None
    rate = min(t.learning_rate, _round_down(safe)) if safe is not None else t.learning_rate
    return {
        "load_in_4bit": True,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": q.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": q.bnb_4bit_use_double_quant,
        "bnb_4bit_compute_dtype": q.bnb_4bit_compute_dtype,
        "mixed_precision": PRECISION_OF_DTYPE.get(q.bnb_4bit_compute_dtype),
        "r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "target_modules": tuple(lora.target_modules),
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": rate,
        "optim": t.optim,
        "gradient_checkpointing": t.gradient_checkpointing,
        "max_grad_norm": t.max_grad_norm,
        "max_seq_length": s.max_seq_length,
        "packing": s.collation.packing,
        "pad_to_max_length": s.collation.packing,
        "attn_implementation": s.collation.attn_implementation,
    }


def _round_down(value: float, digits: int = 3) -> float:
    """``value`` cut (never rounded up) to ``digits`` significant digits: 0.0024668 -> 0.00246."""
    scale = 10 ** (math.floor(math.log10(value)) - digits + 1)
    return float(f"{math.floor(value / scale * (1 + 1e-12)) * scale:.{digits}g}")


def _differs(setting: str, got: Any, want: Any) -> bool:
    if setting == "target_modules" and isinstance(got, tuple | list):
        return set(got) != set(want)
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        return abs(float(got) - want) > 1e-12 * max(1.0, abs(want))
    return bool(got != want)


def changes(reading: Reading, measured: dict[str, Any]) -> dict[str, Any]:
    """The file's keys and the values to write so that the file runs ``measured``: for each setting whose value in
    the file (or its tool's default) differs, :func:`sweeper.export.production.written` under the file's key.

    Raises:
        ValueError: The tool cannot express a measured value (LLaMA-Factory and a float32 compute dtype).
    """
    out: dict[str, Any] = {}
    raw = {line.key: line.value for line in reading.lines if line.status != "default"}
    for setting, want in measured.items():
        got = reading.settings.get(setting)
        if setting == "mixed_precision" and str(raw.get("bf16")).lower() == "auto":
            out.update(written(reading.tool, setting, want, reading))  # auto: the card decides, not the file
            continue
        if setting == "pad_to_max_length" and not got and not want:
            continue
        if setting == "bnb_4bit_compute_dtype" and reading.tool == "llama-factory":
            continue  # bf16/fp16 (mixed_precision) choose it
        if setting == "load_in_8bit" and not got:
            continue
        if setting == "mixed_precision" and got == want:
            continue
        if got is None or _differs(setting, got, want):
            out.update(written(reading.tool, setting, want, reading))
            if setting == "r" and "lora_alpha" not in reading.keys:  # a default derived from the rank (LLaMA-Factory)
                out.update(written(reading.tool, "lora_alpha", measured["lora_alpha"], reading))
    return out


#: Where a key the file lacks goes: after the first of these the file has (else at the end).
_ANCHORS = {
    "lora_target_modules": ("lora_target_linear", "lora_dropout", "lora_alpha", "lora_r"),
    "bnb_config_kwargs": ("load_in_4bit", "adapter", "load_in_8bit"),
    "fp16": ("bf16",),
    "bf16": ("fp16",),
    "neat_packing": ("packing",),
    "pad_to_sequence_len": ("sample_packing", "sequence_len"),
    "sample_packing": ("sequence_len",),
    "optim": ("learning_rate",),
    "optimizer": ("learning_rate",),
    "gradient_checkpointing": ("optimizer", "optim", "learning_rate"),
    "disable_gradient_checkpointing": ("optim", "learning_rate"),
    "dtype": ("load_in_4bit", "model_name_or_path"),
    "double_quantization": ("quantization_bit",),
    "quantization_type": ("quantization_bit",),
}


def _set_yaml(data: Any, key: str, value: Any) -> None:
    """Set a dotted key in a ruamel mapping, a new key after its anchor (:data:`_ANCHORS`) and a new nested map
    where its parent is missing; None switches a key off where the file has it (the line and its comment kept)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    *parents, leaf = key.split(".")
    node = data
    for parent in parents:
        if parent not in node or not isinstance(node[parent], dict):
            _insert(node, parent, CommentedMap())
        node = node[parent]
    if value is None:
        if leaf in node:
            node[leaf] = False
        return
    if isinstance(value, tuple | list):
        seq = CommentedSeq(list(value))
        seq.fa.set_flow_style()
        value = seq
    if leaf in node:
        node[leaf] = value
    else:
        _insert(node, leaf, value)


def _insert(node: Any, key: str, value: Any) -> None:
    """Insert ``key`` after the first of its anchors ``node`` has, or at its end."""
    keys = list(node)
    anchor = next((a for a in _ANCHORS.get(key, ()) if a in node), None)
    if anchor is None or not hasattr(node, "insert"):
        node[key] = value
        return
    node.insert(keys.index(anchor) + 1, key, value)


def _float_yaml(representer: Any, value: float) -> Any:
    """A float as YAML 1.1 reads it back as one (PyYAML reads ``1e-05`` as a string; ``1.0e-05`` is a float)."""
    text = repr(value)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return representer.represent_scalar("tag:yaml.org,2002:float", text)


def _yaml_onto(text: str, edits: dict[str, Any], header: list[str]) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    _, indent, block_seq_indent = load_yaml_guess_indent(text)
    nested = [len(line) - len(line.lstrip(" ")) for line in text.splitlines() if re.match(r" +[\w.-]+:", line)]
    mapping = min(nested, default=2)
    yaml = YAML()  # round trip: comments, order and quoting kept, the file's own indentation
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=mapping, sequence=indent or mapping, offset=block_seq_indent or 0)
    yaml.representer.add_representer(float, _float_yaml)
    yaml.allow_duplicate_keys = True  # as PyYAML and the tools read a file: the last value wins
    data = yaml.load(text)
    for key, value in edits.items():
        _set_yaml(data, key, value)
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    body = buffer.getvalue()
    lines = body.split("\n")
    if lines and lines[0].startswith(HEADER_MARK):  # the header of an earlier --onto: replaced
        lines.pop(0)
        if lines and lines[0].startswith(HEADER_KEYS):
            lines.pop(0)
    return "\n".join(header + lines)


#: Where the json export's nesting keeps each keyword: BitsAndBytesConfig's and LoraConfig's, the rest in
#: ``training_args`` (a key the file lacks goes into its object's nest, as the object reads it).
_NESTS = {
    "bnb_config": ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                   "bnb_4bit_compute_dtype"),
    "lora_config": ("r", "lora_alpha", "lora_dropout", "target_modules"),
}  # fmt: skip
_TOP = ("max_seq_length", "model")


def _json_onto(text: str, edits: dict[str, Any]) -> str:
    data = json.loads(text)
    nested = any(isinstance(data.get(n), dict) for n in ("bnb_config", "lora_config", "training_args"))
    for key, value in edits.items():
        holder = data
        for nest in ("bnb_config", "lora_config", "training_args"):
            if isinstance(data.get(nest), dict) and key in data[nest]:
                holder = data[nest]
        if nested and holder is data and key not in data and key not in _TOP:
            nest = next((n for n, names in _NESTS.items() if key in names), "training_args")
            holder = data.setdefault(nest, {})
        top = key.split(".")[0]
        if "." in key and isinstance(holder.get(top), dict):
            holder = holder[top]
            key = key.split(".", 1)[1]
        if value is None:
            holder.pop(key, None)
        else:
            holder[key] = list(value) if isinstance(value, tuple) else value
    found = re.search(r"\n( +)\S", text)
    indent = len(found.group(1)) if found else None
    return json.dumps(data, indent=indent, ensure_ascii=False) + ("\n" if text.endswith("\n") else "")


def _header(s: ExportSettings, edits: dict[str, Any]) -> list[str]:
    p = s.provenance
    stability = p.stability
    keys = ", ".join(edits) or "none: the file was as measured"
    chance = "" if stability.p_diverge is None else format_chance(stability)
    safe = "" if stability.safe_learning_rate is None else f", safe learning_rate {stability.safe_learning_rate:.3g}"
    return [
        f"{HEADER_MARK} study {p.study!r}, trial {p.trial} (sweeper {dict(p.versions).get('sweeper')}, {p.exported}): "
        f"peak {p.peak_memory_gib} GiB ({p.memory_kind}) under a {p.memory_limit_gib} GiB cap on {p.device}"
        + (f"; P(diverge within {stability.horizon_steps} steps) {chance}{safe}" if chance else "")
        + ".",
        f"{HEADER_KEYS} {keys}. 'sweep export {p.study} --format policy' writes the guard.",
    ]


def _same_model(s: ExportSettings, model: Any) -> bool:
    """Whether the file's model names the measured one (its id, the study's spelling, its local conversion, or the
    same last path part)."""
    names = {s.model, *s.model_aliases}
    last = {str(n).rstrip("/").split("/")[-1].lower() for n in names}
    return model is None or str(model) in names or str(model).rstrip("/").split("/")[-1].lower() in last


def write_onto(
    study: StudySnapshot,
    trial: StoredTrial,
    source: str | Path,
    output: str | Path | None = None,
    force: bool = False,
) -> Onto:
    """Write ``trial``'s measured keys onto the config at ``source`` (see the module's docstring), to ``output``
    (default: ``source`` itself, the original kept once as ``SOURCE.orig``). The file is written to a temporary name
    and renamed: a crash leaves the original whole.

    Raises:
        StudyError: ``source`` cannot be read as a production config, trains another model than the study measured
            (unless ``force``: its figures are not of that model), its tool cannot express the trial, or the output
            cannot be written.
    """
    try:
        reading = read_production(source)
    except ProductionConfigError as exc:
        raise StudyError(f"--onto: {exc}") from None
    if reading.tool == "policy":
        raise StudyError(f"--onto: {source}: a policy's fields are written by --format policy, not --onto")
    if reading.adapter:
        raise StudyError(
            f"--onto: {source}: a peft adapter_config.json describes trained weights; --onto writes training configs "
            "(sweep init --from reads it; write the answer onto the run's training config)"
        )
    s = settings_of(study, trial)
    model = reading.settings.get("model")
    if not force and not _same_model(s, model):
        raise StudyError(
            f"--onto: {source}: trains {model}, but study {study.name!r} measured {s.model}: its peak and safe rate "
            f"are not of {model}; sweep {model} itself ('sweep init --from {source}'), or pass --force to write them "
            "anyway"
        )
    try:
        edits = changes(reading, measured_settings(s))
    except ValueError as exc:
        raise StudyError(
            f"--onto: {source}: {exc}: trial {trial.number} cannot be written onto this {reading.tool} file; choose "
            "a trial that computed in bfloat16 or float16 (--trial N)"
        ) from None
    raw_bytes = Path(source).read_bytes()
    before = raw_bytes.decode("utf-8").replace("\r\n", "\n")
    after = _json_onto(before, edits) if reading.tool == "json" else _yaml_onto(before, edits, _header(s, edits))
    if b"\r\n" in raw_bytes:  # the file's own line ends
        after = after.replace("\n", "\r\n")
    target = (Path(output) if output else Path(source)).resolve()  # a link's target is the file written
    if target.is_dir():
        raise StudyError(f"{target}: -o names a folder; give the file to write")
    backup = None
    diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), str(source), str(target)
        )
    )
    try:
        if target == Path(source).resolve() and not Path(str(source) + ".orig").exists():
            backup = Path(str(source) + ".orig")
            shutil.copy2(target, backup)  # the original, byte for byte
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(after.encode("utf-8"))
        if target.exists():
            shutil.copymode(target, tmp)  # the file's own permissions
        os.replace(tmp, target)
    except OSError as exc:
        raise StudyError(f"{target}: --onto: cannot write ({exc.strerror}); choose a writable path with -o") from None
    raw = {line.key: line.value for line in reading.lines if line.status != "default"}
    changed = {key: (raw.get(key), False if value is None else value) for key, value in edits.items()}
    return Onto(path=target, backup=backup, changed=changed, diff=diff)
