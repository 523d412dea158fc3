"""The data profiled once per command (issue 56): one tokenizer load, one tokenization of the trials' samples, the
whole file read again only when ``max_samples`` left rows out, and what each command shows read from that profile."""

from __future__ import annotations

import json

import pytest

from sweeper.audit import profile_data
from sweeper.data import load_samples
from sweeper.space import DatasetSpec, ModelSpec


def _chat(n: int, words: int) -> dict:
    return {"messages": [{"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": "ok " * words}]}


@pytest.mark.parametrize("max_samples, reads", [(100, 1), (3, 2)])
def test_one_tokenizer_load_and_the_file_read_again_only_when_max_samples_cut_it(
    tiny_model, tmp_path, monkeypatch, max_samples, reads
):
    import sweeper.data
    import sweeper.data._worst as worst

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_chat(i, 5 + 40 * (i == 4))) + "\n" for i in range(6)))
    spec = DatasetSpec(path=str(path), max_samples=max_samples)
    loads, file_reads = [], []
    real_tokenizer, real_samples = sweeper.data.load_tokenizer, worst.load_samples
    monkeypatch.setattr(sweeper.data, "load_tokenizer", lambda *a, **k: loads.append(a) or real_tokenizer(*a, **k))
    monkeypatch.setattr(worst, "load_samples", lambda s: file_reads.append(s) or real_samples(s))
    samples = load_samples(spec)
    profile = profile_data(samples, spec, ModelSpec(name_or_path=str(tiny_model)), str(tiny_model), [64], audit=True)
    assert len(loads) == 1 and len(file_reads) == reads - 1  # the trials' samples read once by the caller
    assert profile.report is not None and profile.report.samples == len(samples)
    # the whole file's longest row (index 4, 40 more words) whether or not the trials sampled it
    assert profile.file.longest == max(t.n_tokens for t in profile_data(
        load_samples(DatasetSpec(path=str(path), max_samples=100)), spec, ModelSpec(name_or_path=str(tiny_model)),
        str(tiny_model), [64]).tokenized)  # fmt: skip
    assert profile.file.sampled == len(samples) and profile.usable == list(samples)
