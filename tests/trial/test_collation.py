"""Collation as production: each micro-batch padded to its longest row, or samples packed into rows of
``max_seq_length`` with no attention across them; the worst-case step measured once without changing training; each
phase's peak apart. The fast tests build batches and run the tiny Llama in-process; the slow ones run real trials."""

from __future__ import annotations

import pytest
import torch

from sweeper.testing import tiny_trial_config, write_jsonl
from sweeper.trial._child.collate import (
    make_collator,
    model_inputs,
    pack_rows,
    sample_indices,
    segments,
    worst_case_rows,
)


def _row(index: int, n: int, supervised_from: int = 0) -> dict:
    ids = [100 + index * 10 + j for j in range(n)]
    return {"input_ids": ids, "labels": [-100] * supervised_from + ids[supervised_from:], "index": index}


def test_padding_pads_each_micro_batch_to_its_longest_row_not_to_max_seq_length():
    collate = make_collator(pad_id=0)
    batch = collate([_row(3, 5), _row(4, 9)])
    assert batch["input_ids"].shape == (2, 9) and "position_ids" not in batch
    assert batch["attention_mask"].sum(dim=1).tolist() == [5, 9]
    assert batch["labels"][0, 5:].tolist() == [-100] * 4 and batch["input_ids"][0, 5:].tolist() == [0] * 4
    assert batch["sample_tokens"].tolist() == [5, 9] and sample_indices(batch) == [3, 4]
    assert segments(batch, 0) == [(3, 0, 5)] and segments(batch, 1) == [(4, 0, 9)]
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask", "labels"}


def test_packing_keeps_the_order_restarts_positions_and_never_splits_a_sample():
    rows = [_row(0, 4), _row(1, 3, supervised_from=1), _row(2, 6), _row(3, 2)]
    packed = pack_rows(rows, max_seq_length=8)
    # In order, greedy: 4 + 3 fit in 8; 6 does not fit beside them; 6 + 2 fit.
    assert [p["index"] for p in packed] == [[0, 1], [2, 3]]
    assert packed[0]["position_ids"] == [0, 1, 2, 3, 0, 1, 2]
    assert packed[0]["input_ids"] == rows[0]["input_ids"] + rows[1]["input_ids"]
    # Each sample's first label is never predicted from the sample before it.
    assert packed[0]["labels"] == [-100, *rows[0]["input_ids"][1:], -100, *rows[1]["input_ids"][1:]]
    batch = make_collator(pad_id=0, packing=True)(packed)
    assert batch["input_ids"].shape == (2, 8) and "attention_mask" not in batch
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]  # the padding is a segment of its own
    assert batch["labels"][0, 7] == -100 and batch["sample_tokens"].tolist() == [7, 8]
    assert sample_indices(batch) == [0, 1, 2, 3]
    assert segments(batch, 0) == [(0, 0, 4), (1, 4, 7)] and segments(batch, 1) == [(2, 0, 6), (3, 6, 8)]
    with pytest.raises(ValueError, match="sample 9 has 9 tokens, more than max_seq_length=8"):
        pack_rows([_row(9, 9)], max_seq_length=8)


def test_the_worst_case_rows_are_the_longest_whatever_their_place():
    rows = [_row(0, 4), _row(1, 12), _row(2, 6), _row(3, 12)]
    assert [r["index"] for r in worst_case_rows(rows, 2)] == [1, 3]
    assert [r["index"] for r in worst_case_rows(rows, 8)] == [1, 3, 2, 0]  # fewer rows than the batch: all of them
    with pytest.raises(ValueError):
        worst_case_rows([], 1)


def test_a_packed_sample_computes_what_it_computes_alone(tiny_model):
    # transformers builds a block-diagonal causal mask from the restarting position ids (sdpa and eager) when the
    # forward has no KV cache (the trial turns it off): no token of a packed row attends to another sample, so each
    # sample's logits are the same as alone, to float32 rounding.
    from transformers import LlamaForCausalLM

    for attn in ("sdpa", "eager"):
        model = LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=attn).eval()
        rows = [_row(0, 7), _row(1, 11), _row(2, 5)]
        packed = make_collator(0, packing=True)(pack_rows(rows, 32))
        with torch.no_grad():
            logits = model(**model_inputs(packed), use_cache=False).logits[0]
            for index, start, end in segments(packed, 0):
                alone = model(input_ids=torch.tensor([rows[index]["input_ids"]])).logits[0]
                torch.testing.assert_close(logits[start:end], alone, rtol=1e-4, atol=1e-4)
            # Without the restart (one long sequence), the later samples see the earlier ones: the test can fail.
            plain = model(input_ids=packed["input_ids"], use_cache=False).logits[0]
            assert not torch.allclose(plain[7:18], logits[7:18], atol=1e-3)


def _short_rows(n: int) -> list[dict]:
    """``n`` short prompt/completion rows of varied lengths (about 15 to 60 tokens with the tiny tokenizer)."""
    return [
        {"prompt": f"What is {k}?", "completion": "It is a number" + ", a whole number" * (k % 7) + "."}
        for k in range(n)
    ]


@pytest.mark.slow
def test_a_trial_trains_on_its_tokens_and_measures_the_worst_step_apart(tiny_model, tmp_path):
    from sweeper.space import DatasetSpec
    from sweeper.trial import Measures, run_trial
    from sweeper.trial._job import StressSettings

    data = write_jsonl(tmp_path / "train.jsonl", _short_rows(24))
    config = tiny_trial_config(
        tiny_model,
        dataset=DatasetSpec(path=str(data), max_samples=24, seed=0),
        max_seq_length=512,
        max_steps=4,
        learning_rate=2e-3,
    )
    stress = StressSettings(steps=4)  # a short stress phase: its margin is compared too
    on = run_trial(config, tmp_path / "on", model_path=str(tiny_model), measures=Measures(stress=stress))
    without = Measures(stress=stress, worst_case=False)
    off = run_trial(config, tmp_path / "off", model_path=str(tiny_model), measures=without)
    assert on.status == off.status == "complete", (on.reason, off.reason)
    # The worst-case step leaves training exactly as it was: the same losses, gradient norms and probe, bit for bit.
    assert on.constant.loss_trace == off.constant.loss_trace
    assert on.constant.grad_norm_trace == off.constant.grad_norm_trace
    assert on.constant.probe_loss_trace == off.constant.probe_loss_trace
    assert on.stress.stability_margin == off.stress.stability_margin
    # Its shape: the data's 2 longest rows, padded to the longer: the data's own length, not max_seq_length.
    rows, tokens = on.memory.worst_case_shape
    assert rows == 2 and 20 < tokens < 100, on.memory.worst_case_shape
    assert off.memory.worst_case_shape is None and "worst_case" not in off.memory.phase_peak_memory_gib
    # Its time is its own, not the training's: train_time_s leaves it out, so tokens_per_s is the training's.
    assert on.constant.worst_case_time_s > 0 and off.constant.worst_case_time_s is None
    phases = on.memory.phase_peak_memory_gib
    assert set(phases) == {"load", "train", "worst_case", "probe", "stress"}, phases
    assert on.memory.peak_memory_gib == max(phases["train"], phases["worst_case"])
    assert on.memory.stress_peak_memory_gib == phases["stress"]
    # Padded to each step's longest row, the rows are mostly the data's own tokens (padded to 512: under 10%).
    assert on.constant.data_token_share > 0.8, on.constant.data_token_share


@pytest.mark.slow
def test_packing_trains_full_rows_end_to_end(tiny_model, tmp_path):
    from sweeper.space import DatasetSpec
    from sweeper.trial import Measures, run_trial
    from sweeper.trial._job import StressSettings

    data = write_jsonl(tmp_path / "train.jsonl", _short_rows(40))
    base = dict(dataset=DatasetSpec(path=str(data), max_samples=40, seed=0), max_seq_length=512, max_steps=3)
    path, stress = str(tiny_model), StressSettings(steps=3)  # a short stress phase: packed trials get a margin too
    packed = run_trial(
        tiny_trial_config(tiny_model, packing=True, **base), tmp_path / "p", model_path=path, measures=Measures(stress)
    )
    padded = run_trial(
        tiny_trial_config(tiny_model, **base), tmp_path / "d", model_path=path, measures=Measures(stress=None)
    )
    assert packed.status == padded.status == "complete", (packed.reason, padded.reason)
    assert packed.constant.data_token_share > 0.8, packed.constant.data_token_share
    # A packed step holds several samples a row: several times the supervised tokens of a padded one.
    assert min(packed.data.supervised_tokens_trace) > 2 * max(padded.data.supervised_tokens_trace)
    assert packed.memory.worst_case_shape[0] == 2 and packed.memory.worst_case_shape[1] <= 512
    assert None not in packed.constant.probe_loss_trace and packed.stress.stability_margin is not None


@pytest.mark.slow
def test_an_oom_at_the_worst_case_step_is_the_configurations_named_as_such(tiny_model, tmp_path):
    # The trained steps hold short rows and fit; one step of the data's longest rows (4 x 16384 tokens, as many as
    # the step of tests/trial/test_warm.py that cannot allocate under this cap) does not.
    from sweeper.space import DatasetSpec
    from sweeper.trial import run_trial

    rows = [{"prompt": f"What is {k}?", "completion": "It is a number."} for k in range(20)]
    rows += [
        {"prompt": "Explain.", "completion": f"Every detail of the import system, again {k}. " * 700} for k in range(4)
    ]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    config = tiny_trial_config(
        tiny_model,
        # Shuffled with seed 2, the long rows are samples 9, 12, 15 and 21: the 2 trained steps read samples 0-7.
        dataset=DatasetSpec(path=str(data), max_samples=24, seed=2),
        per_device_train_batch_size=4,
        max_seq_length=16384,
        max_steps=2,
        memory_limit_gib=0.75,
    )
    result = run_trial(config, tmp_path / "t", model_path=str(tiny_model))
    if result.status == "crash":
        # An allocation that fails under the CPU cap where a library does not check it kills the process with SIGSEGV
        # (sweeper.trial._child.memory.set_cpu_memory_cap; CI at 0933415, once): the sweep retries a crash, as here.
        assert "SIGSEGV" in result.reason, result.reason
        result = run_trial(config, tmp_path / "retry", model_path=str(tiny_model))
    assert result.status == "oom", (result.reason, result.memory)
    assert "at the worst-case step, after step 1" in result.reason and "4 x 16384 tokens" in result.reason
    assert "the data's 4 longest rows" in result.reason
    assert result.constant.steps_done == 1 and "worst_case" in result.memory.phase_peak_memory_gib


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_the_packing_check_passes_block_diagonal_attention_and_fails_attention_across_samples(
    tiny_model, attn_implementation
):
    # issue 55: a trial checks once that its packed rows train each sample as it would alone (a packed sample's
    # logits against the same sample's alone), and fails with a named reason where the attention crossed samples.
    from transformers import AutoModelForCausalLM

    from sweeper.trial._child.checks import PackingCheckError, check_block_diagonal

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn_implementation)
    model.train()
    packed = pack_rows([_row(i, 20 + i) for i in range(4)], 64)
    collate = make_collator(0, packing=True)
    for dtype, within in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        model.to(dtype)
        assert check_block_diagonal(model, packed, collate) < within
        assert model.training  # its mode restored

    def across(rows):  # the positions run on through the row: nothing tells the attention where a sample starts
        batch = collate(rows)
        batch.pop("position_ids")
        return batch

    with pytest.raises(PackingCheckError, match=rf"by 0\.\d+ of their scale .*the attention \({attn_implementation}\)"):
        check_block_diagonal(model, packed, across)
    assert check_block_diagonal(model, pack_rows([_row(0, 20)], 64), collate) is None  # one sample a row: no check
