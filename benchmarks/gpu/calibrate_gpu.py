"""Calibrate the memory model (sweeper/memory/_model.py) against real peaks: short QLoRA steps on a model built from a
config with random weights (memory does not depend on the weights), over a small grid of r, batch, max_seq_length,
gradient checkpointing and double quant. Prints measured, predicted and the error per row.

    python benchmarks/gpu/calibrate_gpu.py                 # on a GPU: a Llama-3-8B-shaped model, within ~10 minutes
    python benchmarks/gpu/calibrate_gpu.py --tiny          # on the CPU: a 2-layer model of the same proportions
    python benchmarks/gpu/calibrate_gpu.py --max-rows 4 --json F   # the short grid of benchmarks/gpu/gpu_check.sh
    python benchmarks/gpu/calibrate_gpu.py --max-rows 2 --expandable-segments --json F   # the allocator's effect

``--expandable-segments`` measures each row again under ``expandable_segments:True`` (set at run time, the cache
emptied between), beside the default allocator: the reserved peak of each and the allocated peak they share
(issue 57: the training key ``expandable_segments``, whose effect the memory model does not yet model).

On CUDA the measured value is ``torch.cuda.max_memory_reserved()`` after two optimizer steps (reset per row). On the
CPU the measured column stays empty: the run checks the harness (model build, loading in 4 bits, QLoRA steps), not
the constants, since one process's resident set is too noisy for that; the term-by-term checks against bytes held
are in tests/memory/test_estimate.py.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

from sweeper.benchmarking import KNOWN_SHAPES, MemorySettings, estimate_memory
from sweeper.memory import ModelShape

#: The memory model's own Llama-3-8B shape (one definition: sweeper.memory.KNOWN_SHAPES).
LLAMA3_8B = KNOWN_SHAPES["meta-llama/Llama-3.1-8B"]
TINY = {
    "hidden_size": 256,
    "intermediate_size": 896,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 8192,
    "tie_word_embeddings": False,
}
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_checkpoint(shape: dict, folder: Path) -> None:
    """Save a random-weight Llama of ``shape`` in bf16 (written shard by shard by ``save_pretrained``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    try:  # memory does not depend on the weights: skip the random init (minutes for 8B parameters on a CPU)
        from transformers.initialization import no_init_weights
    except ImportError:
        import contextlib

        no_init_weights = contextlib.nullcontext

    torch.manual_seed(0)
    with torch.device("cpu"), no_init_weights():
        model = LlamaForCausalLM(LlamaConfig(**shape, max_position_embeddings=8192, dtype=torch.bfloat16))
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="5GB")
    del model
    gc.collect()


def set_expandable_segments(on: bool) -> None:
    """Switch the CUDA caching allocator's ``expandable_segments`` at run time as the trial process does
    (``sweeper.trial._child.memory.set_cuda_allocator``), after handing back what it cached."""
    import torch

    from sweeper.benchmarking import set_cuda_allocator

    torch.cuda.empty_cache()
    set_cuda_allocator(on)


def measure(folder: Path, s: MemorySettings, cuda: bool) -> float:
    """Peak memory in GiB of two QLoRA optimizer steps of ``s`` (CUDA: max_memory_reserved; the allocated peak is
    then ``torch.cuda.max_memory_allocated()``, read before the next row resets it)."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=s.bnb_4bit_use_double_quant,
            bnb_4bit_compute_dtype=torch.bfloat16,
        ),
        dtype=torch.bfloat16,
        attn_implementation="sdpa",
        device_map={"": 0} if cuda else None,
    )
    model = prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=s.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    model = get_peft_model(
        model,
        LoraConfig(
            r=s.r,
            lora_alpha=2 * s.r,
            target_modules=list(s.target_modules),
            lora_dropout=s.lora_dropout,
            task_type="CAUSAL_LM",
        ),
    )
    # from_pretrained returns a model in eval mode, where gradient checkpointing and dropout do nothing: the GPU check
    # of 2026-12-04 measured every row so (the same peak with checkpointing on and off); the Trainer calls train().
    model.train()
    import bitsandbytes as bnb

    optimizer = bnb.optim.PagedAdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    device = "cuda" if cuda else "cpu"
    ids = torch.randint(0, 1000, (s.per_device_train_batch_size, s.max_seq_length), device=device)
    for _ in range(2):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan")
    del model, optimizer, loss
    gc.collect()
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (the CPU path)")
    parser.add_argument("--max-rows", type=int, default=None, help="measure only the first N rows of the grid")
    parser.add_argument("--json", help="also write the rows (measured, predicted, terms) as JSON to this file")
    parser.add_argument(
        "--expandable-segments", action="store_true", help="measure each row again under expandable_segments:True"
    )
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    shape_dict = TINY if args.tiny or not cuda else LLAMA3_8B
    shape = ModelShape.from_config(shape_dict)
    grid = [
        MemorySettings(
            r=r,
            target_modules=ALL,
            per_device_train_batch_size=b,
            max_seq_length=sl,
            gradient_checkpointing=ckpt,
            bnb_4bit_use_double_quant=dq,
            device="cuda" if cuda else "cpu",
        )
        for r, b, sl, ckpt, dq in itertools.product((16, 64), (1, 4), (512, 2048), (True, False), (True,))
    ]
    grid = [s for s in grid if s.gradient_checkpointing or s.per_device_train_batch_size * s.max_seq_length <= 2048]
    grid.append(
        MemorySettings(
            r=16,
            target_modules=ALL,
            per_device_train_batch_size=1,
            max_seq_length=2048,
            bnb_4bit_use_double_quant=False,
            device="cuda" if cuda else "cpu",
        )
    )
    if args.max_rows is not None:
        grid = grid[: args.max_rows]
    rows: list[dict] = []
    device = torch.cuda.get_device_name(0) if cuda else "cpu"

    def write_json(rows: list[dict]) -> None:
        if args.json:
            Path(args.json).write_text(
                json.dumps({"device": device, "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1, default=str)
            )

    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        build_checkpoint(shape_dict, Path(tmp))
        print(
            f"model {'Llama-3-8B-shaped' if shape_dict is LLAMA3_8B else 'tiny'}, built in "
            f"{time.monotonic() - start:.0f} s; device {'cuda' if cuda else 'cpu'}"
        )
        print(f"{'r':>3} {'batch':>5} {'seq':>5} {'ckpt':>5} {'dq':>3} {'measured':>9} {'predicted':>9} {'error':>7}")
        for s in grid:
            estimate = estimate_memory(shape, s)
            predicted = estimate.predicted_peak_gib
            try:
                measured = measure(Path(tmp), s, cuda)
            except torch.OutOfMemoryError:
                measured = float("inf")
            allocator: dict = {}
            if args.expandable_segments and cuda:
                allocator["default"] = {
                    "reserved_gib": measured,
                    "allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                }
                set_expandable_segments(True)
                try:
                    expandable = measure(Path(tmp), s, cuda)
                except torch.OutOfMemoryError:
                    expandable = float("inf")
                allocator["expandable_segments"] = {
                    "reserved_gib": expandable,
                    "allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                }
                set_expandable_segments(False)
                print(f"    expandable_segments:True reserved {expandable:.2f} GiB against {measured:.2f}", flush=True)
            error = (
                (predicted - measured) / measured
                if measured == measured and measured not in (0, float("inf"))
                else float("nan")
            )
            print(
                f"{s.r:>3} {s.per_device_train_batch_size:>5} {s.max_seq_length:>5} "
                f"{'on' if s.gradient_checkpointing else 'off':>5} {'yes' if s.bnb_4bit_use_double_quant else 'no':>3} "
                f"{measured:9.2f} {predicted:9.2f} {100 * error:+6.1f}%",
                flush=True,
            )
            rows.append(
                {
                    "r": s.r,
                    "per_device_train_batch_size": s.per_device_train_batch_size,
                    "max_seq_length": s.max_seq_length,
                    "gradient_checkpointing": s.gradient_checkpointing,
                    "bnb_4bit_use_double_quant": s.bnb_4bit_use_double_quant,
                    "measured_gib": measured if measured == measured and measured != float("inf") else None,
                    "predicted_gib": predicted,
                    "terms_gib": estimate.terms_gib,
                    **({"allocator": allocator} if allocator else {}),
                }
            )
            write_json(rows)  # after every row: a time limit that stops the grid keeps the rows measured
        print(f"total {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
