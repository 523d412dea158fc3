"""Run a ``sweep export`` file as its production stack would: the ``hf`` file's objects train a transformers
``Trainer``, the ``trl`` file's ``build_trainer`` builds and trains a real ``SFTTrainer``, both for two steps on the
CPU. Imported by the tests, and run as a script in a side environment with other library versions
(``python export_check.py HF.py TRL.py MODEL_DIR OUT_DIR [PACKED_TRL.py]``: prints one JSON object; the last, the trl
file of a trial that packed samples)."""

from __future__ import annotations

import dataclasses
import json
import runpy
import sys
from pathlib import Path

#: A chat row, an assistant-first row and a multi-turn row, as the trial reads them.
CHAT_ROWS = [
    {
        "messages": [
            {"role": "user", "content": "What does the for statement do?"},
            {"role": "assistant", "content": "It iterates over the elements of a sequence."},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is a module?"},
            {"role": "assistant", "content": "A file of definitions."},
            {"role": "user", "content": "And a package?"},
            {"role": "assistant", "content": "A folder of modules."},
        ]
    },
]


#: Six short exchanges: three or more fit a packed row of 64 tokens.
SHORT_ROWS = [
    {"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w.title()}."}]}
    for w in ("one", "two", "three", "four", "five", "six")
]


def versions() -> dict[str, str]:
    from importlib import metadata

    return {p: metadata.version(p) for p in ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes")}


def frozen_float_dtypes(model) -> list[str]:
    """The dtypes of the model's frozen floating-point weights (embeddings, norms, lm_head: the 4-bit layers' weights
    are not floating point): float32 once prepared as the trial prepares it."""
    return sorted({str(p.dtype) for p in model.parameters() if not p.requires_grad and p.is_floating_point()})


def _short(out: Path) -> dict:
    return dict(output_dir=str(out), max_steps=2, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True)


def train_hf(py: Path, model_dir: Path, out: Path) -> dict:
    """The hf export's objects: the 4-bit model of ``bnb_config``, ``lora_config``, two steps of ``Trainer`` on rows
    of 24 to 32 tokens, batched by the file's ``make_data_collator``; and the shape of the first micro-batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    ns = runpy.run_path(str(py))
    bnb, args = ns["bnb_config"], ns["training_args"]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tokenizer("The for statement is used to iterate over the elements of a sequence. " * 4)["input_ids"]
    rows = [{"input_ids": ids[: 24 + i % 9], "labels": ids[: 24 + i % 9]} for i in range(32)]
    collator = ns["make_data_collator"](tokenizer)
    first = collator(rows[:2])
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), quantization_config=bnb, dtype=bnb.bnb_4bit_compute_dtype
    )
    model = ns["adapt_model"](model)  # the trial's preparation and its LoRA
    short = dataclasses.replace(args, **_short(out))
    result = Trainer(model=model, args=short, train_dataset=rows, data_collator=collator).train()
    return {
        "frozen_float_dtypes": frozen_float_dtypes(model),
        "first_batch": list(first["input_ids"].shape),
        "first_batch_padding_labels": first["labels"][0, 24:].tolist(),
        "global_step": result.global_step,
        "loss": result.training_loss,
        "checkpointing": bool(getattr(args, ns["CHECKPOINTING"])),
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
    }


def build_trl(py: Path, model_dir: Path, out: Path, rows: list[dict]) -> tuple[dict, object]:
    """The trl export's ``build_trainer`` on the model and tokenizer at ``model_dir``; returns its namespace and the
    trainer (not trained)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ns = runpy.run_path(str(py))
    bnb = ns["bnb_config"]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), quantization_config=bnb, dtype=bnb.bnb_4bit_compute_dtype
    )
    return ns, ns["build_trainer"](model, tokenizer, rows, **_short(out))


def train_trl(py: Path, model_dir: Path, out: Path, rows: list[dict] | None = None) -> dict:
    """Build the trl export's ``SFTTrainer`` and train two steps; what it trained on and how."""
    import torch

    ns, trainer = build_trl(py, model_dir, out, rows or CHAT_ROWS)
    args = trainer.args
    first = trainer.train_dataset[0]
    supervised = [t for t in first["labels"] if t != -100] if "labels" in first else None
    # The first micro-batch as TRL's collator builds it: with packing, one row of the packed rows' samples (padding
    # free), their position ids restarting at each, and no attention mask.
    rows_in_batch = [
        trainer.train_dataset[i] for i in range(min(args.per_device_train_batch_size, len(trainer.train_dataset)))
    ]
    batch = trainer.data_collator(rows_in_batch)
    adapters = {str(p.dtype) for p in trainer.model.parameters() if p.requires_grad}
    result = trainer.train()
    return {
        "global_step": result.global_step,
        "loss": result.training_loss,
        "rows": len(trainer.train_dataset),
        "assistant_only_loss": bool(args.assistant_only_loss),
        "completion_only_loss": bool(args.completion_only_loss),
        "supervised_first_row": supervised,
        "adapter_dtypes": sorted(adapters),
        "frozen_float_dtypes": frozen_float_dtypes(trainer.model),
        "checkpointing": bool(getattr(args, ns["CHECKPOINTING"])),
        "bf16": bool(args.bf16),
        "max_length": args.max_length,
        "finite": bool(torch.isfinite(torch.tensor(result.training_loss))),
        "packing": bool(args.packing),
        "packing_strategy": args.packing_strategy,
        "padding_free": bool(args.padding_free),
        "batch_keys": sorted(batch),
        "batch_shape": list(batch["input_ids"].shape),
        "samples_in_batch": sum(len(r.get("seq_lengths") or [0]) for r in rows_in_batch),
        "position_starts": int((batch["position_ids"] == 0).sum()) if "position_ids" in batch else None,
    }


if __name__ == "__main__":
    hf, trl, model_dir, out, *packed = (Path(a) for a in sys.argv[1:6])
    report = {
        "versions": versions(),
        "hf": train_hf(hf, model_dir, out / "hf"),
        "trl": train_trl(trl, model_dir, out / "trl"),
    }
    if packed:
        report["trl_packed"] = train_trl(packed[0], model_dir, out / "trl-packed", SHORT_ROWS)
    print(json.dumps(report))
