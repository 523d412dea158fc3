"""What the two YAML exports (axolotl, LLaMA-Factory) share: the YAML text with its comments, and the training keys
both spell as transformers does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeper.export._settings import TrainingSettings


def yaml_text(header: list[str], data: Mapping[str, Any], comments: Mapping[str, str]) -> str:
    """YAML of ``data`` in order, with the header comment and a comment after the keys named in ``comments``."""
    import json

    import yaml

    lines = list(header) + [""]
    for key, value in data.items():
        if isinstance(value, (list, dict)):  # one line: [q_proj, v_proj], {bnb_4bit_quant_type: nf4, ...}
            text = f"{key}: " + yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
        elif isinstance(value, str) and "\n" in value:  # a template: one line, as a JSON string (which YAML reads)
            text = f"{key}: {json.dumps(value)}"
        else:
            text = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False, width=1000).rstrip("\n")
        if key in comments:
            first, *rest = text.split("\n")
            text = "\n".join([f"{first}  # {comments[key]}", *rest])
        lines.append(text)
    return "\n".join(lines) + "\n"


def same_named_training(t: TrainingSettings) -> dict[str, Any]:
    """The ``TrainingArguments`` keys axolotl and LLaMA-Factory both spell as transformers does."""
    return {
        "max_grad_norm": t.max_grad_norm,
        "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay,
        "bf16": t.bf16,
        "fp16": t.fp16,
        "seed": t.seed,
    }
