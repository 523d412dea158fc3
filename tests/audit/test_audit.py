"""The dataset audit on small datasets built here, tokenized by the tiny model's real tokenizer exactly as trials
tokenize them: each fault kind found with the right dataset indices, and a clean dataset with no findings."""

import sys

import pytest

from sweeper.audit._findings import audit_samples
from sweeper.audit._lengths import length_percentiles, longest_repeated_span, supervised_tokens
from sweeper.audit._nan import first_nan_step
from sweeper.data import load_samples, load_tokenizer, tokenize_samples
from sweeper.space import DatasetSpec
from sweeper.testing import clean_rows, write_jsonl


def audit(tmp_path, tokenizer_dir, rows, lengths, vocab_size=None):
    samples = load_samples(DatasetSpec(path=str(write_jsonl(tmp_path / "d.jsonl", rows))))
    tokenized = tokenize_samples(samples, load_tokenizer(str(tokenizer_dir)), sys.maxsize)
    return audit_samples(samples, tokenized, lengths, vocab_size), tokenized


def kinds(report) -> dict:
    return {(f.kind, f.max_seq_length): f.samples for f in report.findings}


def test_clean_dataset_has_no_findings(tiny_model, tmp_path):
    report, _ = audit(tmp_path, tiny_model, clean_rows(), [256], vocab_size=512)
    assert report.findings == [] and report.samples == 10
    assert set(report.length_percentiles) == {"min", "p50", "p90", "p95", "p99", "max", "mean"}
    assert report.to_dict()["findings"] == []


def test_reply_cut_away_is_named_at_the_short_length_only(tiny_model, tmp_path):
    rows = clean_rows()
    rows[6] = {"prompt": "Explain every detail of the import system. " * 8, "completion": "It is long."}
    report, tokenized = audit(tmp_path, tiny_model, rows, [48, 512])
    found = kinds(report)
    assert found[("no_supervised_tokens", 48)] == [6]
    assert ("no_supervised_tokens", 512) not in found and ("truncated", 512) not in found
    assert 6 in found[("truncated", 48)]
    assert [f.kind for f in report.nan_findings] == ["no_supervised_tokens"]
    assert report.nan_findings[0].to_dict()["nan_risk"] is True


def test_out_of_vocabulary_id(tiny_model_extra_token, tmp_path):
    rows = clean_rows()
    rows[3] = {"prompt": "Call the tool.", "completion": "<|tool|> search(lists)"}
    report, _ = audit(tmp_path, tiny_model_extra_token, rows, [256], vocab_size=512)
    (finding,) = [f for f in report.findings if f.kind == "invalid_token_id"]
    assert finding.samples == [3] and finding.nan_risk and "512" in finding.detail


def test_repeated_span_duplicates_empty_reply_and_unusual_characters(tiny_model, tmp_path):
    rows = clean_rows()
    rows[1] = {"prompt": "Say it again.", "completion": "and again " * 40}
    rows[4] = dict(rows[2])  # an exact duplicate of sample 2
    rows[5] = {"prompt": "What is an empty reply?", "completion": "   "}
    rows[7] = {"prompt": "What is a bell?", "completion": "A control character: \x07 rings."}
    rows[8] = {"prompt": "Broken encoding?", "completion": "It reads caf\ufffd, a decoding error."}
    rows[9] = {"prompt": "Punctuation？", "completion": "Full-width marks（like these）in English text."}
    rows.append({"prompt": "日本語の句読点は？", "completion": "これは普通です。（全角）"})  # CJK: full-width is normal
    report, _ = audit(tmp_path, tiny_model, rows, [512])
    found = kinds(report)
    assert found[("repeated_span", None)] == [1]
    assert found[("duplicate", None)] == [2, 4]
    assert found[("empty_response", None)] == [5]
    assert found[("unusual_characters", None)] == [7, 8, 9]
    detail = next(f.detail for f in report.findings if f.kind == "unusual_characters")
    assert "control" in detail and "U+FFFD" in detail and "full-width" in detail
    assert report.nan_findings == []


def test_extreme_length_outlier(tiny_model, tmp_path):
    rows = clean_rows()
    rows[0] = {"prompt": "Tell me about lists.", "completion": " ".join(f"Item {i} of a long list." for i in range(80))}
    report, _ = audit(tmp_path, tiny_model, rows, [4096])
    assert kinds(report)[("too_long", None)] == [0]


def test_rows_of_one_length_have_no_outlier_a_few_tokens_over():
    """With nearly every row of one length the IQR is 0: a row 2 tokens over the rest is no outlier, one of twice
    the median is."""
    from sweeper.data import Sample, TokenizedSample

    def rows(lengths):
        samples = [Sample(index=i, text="x") for i in range(len(lengths))]
        tokenized = [
            TokenizedSample(index=i, input_ids=[5] * n, labels=[5] * n, n_tokens=n) for i, n in enumerate(lengths)
        ]
        return audit_samples(samples, tokenized, [4096])

    assert "too_long" not in {f.kind for f in rows([100] * 9 + [102]).findings}
    [finding] = [f for f in rows([100] * 9 + [250]).findings if f.kind == "too_long"]
    assert finding.samples == [9] and "2x the median 100" in finding.detail


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([1, 2, 3, 4, 5], (0, 0, 0)),
        ([9, 7, 7, 7, 7, 8], (4, 1, 1)),
        ([5, 1, 2, 1, 2, 1, 2, 6], (6, 2, 1)),
        ([3, 3, 3, 3], (4, 1, 0)),  # a run of one token is also 2-periodic: the smallest period is reported
    ],
)
def test_longest_repeated_span(ids, expected):
    assert longest_repeated_span(ids) == expected


def test_supervised_tokens_skip_position_zero():
    assert supervised_tokens([5, -100, -100], 3) == 0  # position 0 is never a target after the causal shift
    assert supervised_tokens([-100, -100, 7, 8], 4) == 2
    assert supervised_tokens([-100, -100, 7, 8], 3) == 1


def test_length_percentiles():
    p = length_percentiles([10, 20, 30, 40, 50])
    assert p["min"] == 10 and p["max"] == 50 and p["p50"] == 30 and p["mean"] == 30 and p["p90"] == 46
    assert length_percentiles([]) == {}


def test_first_nan_step_follows_trial_order(tiny_model, tmp_path):
    rows = clean_rows()
    rows[6] = {"prompt": "Explain every detail of the import system. " * 8, "completion": "It is long."}
    _, tokenized = audit(tmp_path, tiny_model, rows, [48])
    position = [t.index for t in tokenized].index(6)
    hit = first_nan_step(tokenized, 48, 1, 1, max_steps=len(rows))
    assert hit is not None and hit.step == position + 1 and hit.samples == [6]
    assert first_nan_step(tokenized, 48, 1, 1, max_steps=position) is None  # the run ends before reaching it
    assert first_nan_step(tokenized, 48, 2, 1, max_steps=len(rows)) is None  # its batch has another row to learn from
    assert first_nan_step(tokenized, 512, 1, 1, max_steps=len(rows)) is None


def test_dropped_rows_and_bad_special_token_rows_are_findings(tiny_model, tmp_path):
    import math

    from sweeper.audit import nan_risks
    from sweeper.data import DroppedRow, SpecialTokenRow
    from sweeper.report._data_text import format_audit, format_data_warnings, format_dropped_rows

    samples = load_samples(DatasetSpec(path=str(write_jsonl(tmp_path / "d.jsonl", clean_rows()))))
    tokenizer = load_tokenizer(str(tiny_model))
    tokenized = tokenize_samples(samples, tokenizer, sys.maxsize)
    eos = tokenizer.eos_token_id
    dropped = [DroppedRow(12, "no assistant turn"), DroppedRow(10, "no assistant turn"), DroppedRow(11, "empty text")]
    special = [
        SpecialTokenRow(roles=("pad",), token="<pad>", id=600, max_abs=math.nan),
        SpecialTokenRow(roles=("eos",), token="<|im_end|>", id=eos, max_abs=1e5),
        SpecialTokenRow(roles=("bos",), token="<s>", id=601, max_abs=0.5),
    ]
    report = audit_samples(
        samples, tokenized, [256], dropped=dropped, special_tokens=special, compute_dtypes=["bfloat16"]
    )
    by_reason = [(f.samples, f.detail) for f in report.findings if f.kind == "dropped_row"]
    assert by_reason == [
        ([10, 12], "2 rows not trained on: no assistant turn: 10, 12"),
        ([11], "1 row not trained on: empty text: 11"),
    ]
    assert report.samples == 10
    bad = [f for f in report.findings if f.kind == "bad_embedding_row"]
    # The pad row holds NaN: every padded sample; the eos row's 1e5 fits bfloat16, the only dtype searched.
    assert len(bad) == 1 and bad[0].nan_risk and bad[0].samples == sorted(s.index for s in samples)
    assert "'<pad>' (id 600)" in bad[0].detail and "holds NaN" in bad[0].detail
    fp16 = audit_samples(samples, tokenized, [256], special_tokens=special, compute_dtypes=["bfloat16", "float16"])
    [eos_finding] = [f for f in fp16.findings if f.kind == "bad_embedding_row" and "(id 600)" not in f.detail]
    assert "beyond float16's largest value 65504" in eos_finding.detail
    assert eos_finding.samples == sorted(t.index for t in tokenized if eos in t.input_ids)
    [risk] = [r for r in nan_risks(report, tokenized, [2], [1], 3) if r.finding.kind == "bad_embedding_row"]
    assert risk.strikes[(2, 1)].step == 1
    warnings = format_data_warnings(report, [risk], several_accumulations=False, doctor="sweep doctor s.yaml")
    assert warnings[0].startswith("WARNING data: the pad token '<pad>' (id 600)") and "step 1" in warnings[0]
    assert "NaN risk: bad_embedding_row (10 samples)" in format_audit(report)
    line = format_dropped_rows(dropped, 13, "d.jsonl", doctor="sweep doctor s.yaml")
    assert line == (
        "WARNING data: 3 of 13 rows of d.jsonl are not trained on: 2 no assistant turn (rows 10, 12); "
        "1 empty text (row 11) (sweep doctor s.yaml)"
    )
    assert format_dropped_rows([], 10, "d.jsonl", doctor="x") is None


def test_audit_leaves_out_rows_the_template_refuses(tiny_model, tmp_path):
    from sweeper.data import Sample

    good = Sample(index=0, messages=({"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}))
    other = Sample(index=1, messages=({"role": "user", "content": "Q2"}, {"role": "assistant", "content": "B"}))
    tokenized = tokenize_samples([good, other], load_tokenizer(str(tiny_model)), sys.maxsize)[:1]
    assert audit_samples([good, other], tokenized, [64]).samples == 1
    with pytest.raises(ValueError, match="same order"):
        audit_samples([good, other], tokenize_samples([other, good], load_tokenizer(str(tiny_model)), 64), [64])


def test_the_duplicate_finding_counts_every_index_it_does_not_show(tmp_path):
    from sweeper.audit._findings import _duplicate_findings

    rows = clean_rows()
    data = [rows[0]] * 6 + [rows[1], rows[1], rows[2], rows[2], rows[3], rows[3], rows[4], rows[4]]
    samples = load_samples(DatasetSpec(path=str(write_jsonl(tmp_path / "d.jsonl", data)), max_samples=100, seed=0))
    [finding] = _duplicate_findings(samples)
    assert len(finding.samples) == 14
    # 5 groups, 3 shown: the rest is counted, not dropped (a group of 6 shows 4 indices "and 2 more").
    assert finding.detail.endswith("; and 2 more groups"), finding.detail
    shown = finding.detail.split(": ", 1)[1].removesuffix("; and 2 more groups").split("; ")
    assert all(part.count(" = ") == 3 and part.endswith(" and 2 more") for part in shown if part.count(" = ") >= 3)
    assert " ..." not in finding.detail
