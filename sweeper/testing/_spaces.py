"""Space files for tests: the tiny model's spaces, and writing a space or a JSON-lines dataset to a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from sweeper.space import TrialConfig


def tiny_space(
    model: Path,
    *,
    name: str = "t",
    search: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    n_trials: int = 2,
    max_samples: int = 32,
) -> dict[str, Any]:
    """A space (as the parsed YAML mapping) on the tiny model at ``model`` that trains in about a second per trial:
    3 steps of 64 tokens, a 4 GiB cap, a 3-minute trial timeout, ``r`` searched over 4 and 8 unless ``search``
    says otherwise."""
    return {
        "study": {"name": name, "n_trials": n_trials, "seed": 0},
        "model": {"name_or_path": str(model)},
        "dataset": {"path": "builtin:pydoc-topics", "max_samples": max_samples},
        "training": {
            "max_steps": 3,
            "memory_limit_gib": 4,
            "trial_timeout": "3m",
            "max_seq_length": 64,
            "optim": "adamw_torch",
            **(training or {}),
        },
        "search": search if search is not None else {"r": [4, 8]},
    }


def data_nan_space(model: Path) -> dict[str, Any]:
    """Two trials on the tiny model, max_seq_length 16 or 64 at batch 1: at 16 tokens the built-in samples' question
    fills the row, no reply token is left and every step's loss is 0/0 (a NaN caused by the data)."""
    space = tiny_space(
        model, search={"max_seq_length": [16, 64]}, training={"per_device_train_batch_size": 1}, n_trials=2
    )
    space["study"]["sampler"] = "random"
    del space["training"]["max_seq_length"]
    return space


def write_space(folder: Path, space: dict[str, Any], name: str = "space.yaml") -> Path:
    """Write ``space`` as YAML to ``folder/name`` and return the path."""
    path = folder / name
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines and return ``path``."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


#: A configuration for the memory model's and the dominance rule's tests: batch 2 x 512 tokens, r 16 on q/v, a 1.7 GiB
#: cap with the default 10% margin.
MEMORY_BASE = TrialConfig(
    per_device_train_batch_size=2,
    max_seq_length=512,
    r=16,
    target_modules=("q_proj", "v_proj"),
    bnb_4bit_compute_dtype="bfloat16",
    gradient_checkpointing=True,
    bnb_4bit_use_double_quant=True,
    gradient_accumulation_steps=1,
    optim="paged_adamw_8bit",
    lora_dropout=0.05,
    memory_limit_gib=1.7,
    preflight_margin=0.1,
)
