"""Why a trial went NaN, decided on real runs of the tiny Llama: each fault is real data or real numerics (a reply
truncated away, an id the embedding has no row for, fp16 overflow, SGD diverging in fp32), never a mocked value."""

import json

import pytest

from sweeper.space import DatasetSpec, ModelSpec, TrialConfig
from sweeper.testing import clean_rows, write_jsonl
from sweeper.trial import run_trial

pytestmark = pytest.mark.slow


def _config(model, **kw) -> TrialConfig:
    base = {
        "max_steps": 3,
        "max_seq_length": 64,
        "per_device_train_batch_size": 2,
        "r": 4,
        "optim": "adamw_torch",
        "memory_limit_gib": 4.0,
        "trial_timeout_s": 180.0,
        "model": ModelSpec(name_or_path=str(model)),
        "dataset": DatasetSpec(max_samples=32),
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    return TrialConfig(**{**base, **kw})


def _nan_batch(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "nan_batch.jsonl").read_text().splitlines()]


def test_reply_truncated_away_is_a_data_nan_naming_the_sample(tiny_model, tmp_path):
    rows = clean_rows()
    rows[6] = {"prompt": "Explain every detail of the import system. " * 8, "completion": "It is long."}
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    config = _config(
        tiny_model,
        per_device_train_batch_size=1,
        max_seq_length=48,
        max_steps=len(rows),
        dataset=DatasetSpec(path=str(data)),
    )
    result = run_trial(config, tmp_path / "t", model_path=str(tiny_model))
    assert result.status == "nan" and result.nan.cause == "data", result.reason
    assert result.nan.samples == [6] and "no supervised token" in result.reason
    assert result.data.min_supervised_tokens == 0 and result.data.supervised_tokens_trace[-1] == 0
    assert all(n > 0 for n in result.data.supervised_tokens_trace[:-1])
    (row,) = _nan_batch(tmp_path / "t")
    assert row["index"] == 6 and row["at_fault"] and row["supervised_tokens"] == 0 and row["truncated"]
    assert row["tokens_trained"] == 48 and row["tokens_before_truncation"] > 48 and "import system" in row["text"]
    assert "It is long." in row["text_cut_away"] and "It is long." not in row["text"]


def test_id_beyond_the_vocabulary_is_a_data_nan(tiny_model_extra_token, tmp_path):
    rows = clean_rows()
    rows[3] = {"prompt": "Call the tool.", "completion": "<|tool|> search(lists)"}
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    config = _config(
        tiny_model_extra_token, per_device_train_batch_size=1, max_steps=len(rows), dataset=DatasetSpec(path=str(data))
    )
    result = run_trial(config, tmp_path / "t", model_path=str(tiny_model_extra_token))
    assert result.status == "nan" and result.nan.cause == "data", result.reason
    assert result.nan.samples == [3] and "512" in result.reason and result.fail_phase == "forward"
    (row,) = _nan_batch(tmp_path / "t")
    assert row["invalid_token_ids"] == [512] and row["at_fault"]


def test_fp16_overflow_is_a_precision_nan(tiny_model, tmp_path):
    # An adapter scale of 1000 and a learning rate of 1 push the 4-bit layers' outputs past fp16's 65504 (in float32
    # the same run completes: tests/trial/test_worker.py::test_the_run_that_overflows_fp16_completes_in_fp32).
    config = _config(
        tiny_model, bnb_4bit_compute_dtype="float16", lora_alpha_ratio=1000.0, learning_rate=1.0, max_steps=8
    )
    result = run_trial(config, tmp_path, model_path=str(tiny_model))
    assert result.status == "nan" and result.nan.cause == "precision", result.reason
    assert result.fail_phase in ("forward", "backward") and 1 <= result.fail_step < 8
    assert result.constant.loss_trace[-1] is None or result.constant.grad_norm_trace[-1] is None
    assert result.nan.module and result.nan.module.startswith("model.layers.")
    assert "fp32 replay" in result.reason and result.nan.module in result.reason
    rows = _nan_batch(tmp_path)
    assert len(rows) == 2 and sorted(result.nan.samples) == sorted(r["index"] for r in rows)
    assert all(r["fp32_finite"] and r["fp32_loss"] > 0 and not r["at_fault"] for r in rows)


def test_divergence_in_fp32_is_an_optimization_nan(tiny_model, tmp_path):
    # Plain SGD at learning rate 10 with lora_alpha/r 100 and no clipping: the gradient norm grows about 1e11x over five
    # steps and the loss overflows even in float32.
    config = _config(
        tiny_model,
        bnb_4bit_compute_dtype="float32",
        optim="sgd",
        learning_rate=10.0,
        lora_alpha_ratio=100.0,
        max_grad_norm=0.0,
        max_steps=12,
    )
    result = run_trial(config, tmp_path, model_path=str(tiny_model))
    assert result.status == "nan" and result.nan.cause == "optimization", result.reason
    assert "learning_rate 10" in result.reason and result.fail_step > 2
    assert all(r["fp32_finite"] is False for r in _nan_batch(tmp_path))


def test_complete_trial_records_supervised_tokens_and_sample_lengths(tiny_model, tmp_path):
    result = run_trial(_config(tiny_model), tmp_path, model_path=str(tiny_model))
    assert result.status == "complete", result.reason
    assert len(result.data.supervised_tokens_trace) == 3 and result.data.min_supervised_tokens > 0
    assert result.data.longest_sample_tokens > 64 and 0 < result.data.truncated_sample_fraction <= 1
    assert result.nan.cause is None and result.nan.samples == []
    assert not (tmp_path / "nan_batch.jsonl").exists()


@pytest.fixture(scope="module")
def pad_models(tmp_path_factory):
    """The tiny Llama with an added ``<pad>`` whose embedding row is NaN, and one whose row is 1e5 (finite, beyond
    float16's 65504)."""
    from sweeper.testing import build_pad_token_model

    return {
        "nan": build_pad_token_model(tmp_path_factory.mktemp("pad-nan")),
        "1e5": build_pad_token_model(tmp_path_factory.mktemp("pad-1e5"), 1e5),
    }


@pytest.mark.parametrize(
    ("row", "dtype"), [("nan", "bfloat16"), ("nan", "float32"), ("1e5", "float16"), ("1e5", "bfloat16")]
)
def test_a_bad_pad_embedding_row_is_a_data_nan_only_in_padded_steps(pad_models, tmp_path, row, dtype):
    # The case: before, "precision: bfloat16 overflowed in model.embed_tokens" in bf16 and "cause unknown"
    # in fp32, because each row was replayed alone without its padding.
    from sweeper.testing import PAD_ID, long_reply_rows

    # Trial order 4, 2, 1, 0, 5, 3: at batch 2 the third step holds the long row 5 and the short row 3, padded to
    # row 5's length (at batch 1 nothing is padded: each micro-batch is padded to its longest row).
    data = write_jsonl(tmp_path / "d.jsonl", long_reply_rows(6, short=3))
    config = _config(
        pad_models[row],
        per_device_train_batch_size=2,
        max_seq_length=32,
        max_steps=3,
        bnb_4bit_compute_dtype=dtype,
        dataset=DatasetSpec(path=str(data)),
    )
    result = run_trial(config, tmp_path / "t", model_path=str(pad_models[row]))
    if (row, dtype) == ("1e5", "bfloat16"):  # bfloat16 holds 1e5: nothing to blame
        assert result.status == "complete", result.reason
        return
    assert result.status == "nan" and result.fail_step == 3 and result.nan.cause == "data", result.reason
    assert all(x is not None for x in result.constant.loss_trace[:2])  # the unpadded steps train
    assert result.nan.samples == [3] and "pad token" in result.reason and f"(id {PAD_ID})" in result.reason
    assert "pads sample 3" in result.reason and "precision" not in result.reason
    if dtype == "float16":
        assert "beyond float16's 65504" in result.reason
    rows = _nan_batch(tmp_path / "t")
    assert [(r["index"], r["at_fault"]) for r in rows] == [(5, False), (3, True)]
