"""Datasets a user brings (four formats, four file types, auto-detected), the built-in corpus, and the loss mask."""

import json

import pytest

from sweeper.data import BUILTIN_PYDOC, detect_format, load_samples, tokenize_samples
from sweeper.errors import DataError
from sweeper.space import DatasetSpec

ROWS = {
    "text": [{"text": "def f(x): return x"}, {"text": "class A: pass"}],
    "prompt_completion": [
        {"prompt": "What is a list?", "completion": "A mutable sequence."},
        {"prompt": "What is a tuple?", "completion": "An immutable sequence."},
    ],
    "alpaca": [
        {"instruction": "Define", "input": "dict", "output": "A mapping."},
        {"instruction": "Define set", "input": "", "output": "An unordered collection."},
    ],
    "chat": [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4."},
            ]
        },
    ],
}


def _write(tmp_path, fmt, suffix):
    import datasets

    rows = ROWS[fmt]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        datasets.Dataset.from_list(rows).to_csv(str(path))
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.mark.parametrize("fmt", sorted(ROWS))
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_formats_and_file_types_are_detected(tmp_path, fmt, suffix):
    if fmt == "chat" and suffix == ".csv":
        pytest.skip("a list of messages has no CSV form")
    samples = load_samples(DatasetSpec(path=str(_write(tmp_path, fmt, suffix))))
    assert len(samples) == 2
    if fmt == "text":
        assert all(s.text for s in samples)
    else:
        assert all(s.messages[-1]["role"] == "assistant" for s in samples)


def test_detect_format_names_columns_when_unknown():
    with pytest.raises(DataError, match=r"\['a', 'b'\]"):
        detect_format(["a", "b"])


def test_missing_file_and_no_usable_rows(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_samples(DatasetSpec(path=str(tmp_path / "nope.jsonl")))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(DataError, match="no usable rows"):
        load_samples(DatasetSpec(path=str(empty)))


def test_builtin_corpus_is_seeded_and_capped():
    a = load_samples(DatasetSpec(path=BUILTIN_PYDOC, max_samples=50, seed=1))
    b = load_samples(DatasetSpec(path=BUILTIN_PYDOC, max_samples=50, seed=1))
    c = load_samples(DatasetSpec(path=BUILTIN_PYDOC, max_samples=50, seed=2))
    assert [s.index for s in a] == [s.index for s in b] != [s.index for s in c]
    assert len(a) == 50 and len(load_samples(DatasetSpec(path=BUILTIN_PYDOC, max_samples=10**6))) > 200
    assert "Explain the Python language topic" in a[0].messages[0]["content"]


def test_loss_only_on_replies(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sample = load_samples(DatasetSpec(path=BUILTIN_PYDOC, max_samples=1))[0]
    [tok] = tokenize_samples([sample], tokenizer, max_seq_length=4096)
    supervised = tokenizer.decode([t for t in tok.labels if t != -100])
    prompt = tokenizer.decode([t for t, lab in zip(tok.input_ids, tok.labels) if lab == -100])
    assert sample.messages[1]["content"][:40] in supervised and "Explain the Python" in prompt
    assert "Explain the Python" not in supervised
    [cut] = tokenize_samples([sample], tokenizer, max_seq_length=16)
    assert len(cut.input_ids) == 16 and cut.n_tokens == tok.n_tokens > 16


def test_unreadable_files_name_the_cause(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DataError) as info:
        load_samples(DatasetSpec(path=str(bad)))
    [line] = info.value.problems
    assert line.startswith(f"{bad}: dataset.path: cannot read it as json") and "Error" in line
    with pytest.raises(DataError, match="is a directory"):
        load_samples(DatasetSpec(path=str(tmp_path)))
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        (tmp_path / "notes.txt").write_text("hi")
        load_samples(DatasetSpec(path=str(tmp_path / "notes.txt")))


@pytest.mark.parametrize(("content", "needle"), [("", "the file is empty"), ("\n\n  \n", "the file is empty")])
def test_empty_files_say_so(tmp_path, content, needle):
    path = tmp_path / "blank.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=needle):
        load_samples(DatasetSpec(path=str(path)))
    header_only = tmp_path / "header.csv"
    header_only.write_text("prompt,completion\n")
    with pytest.raises(DataError, match="no data rows"):
        load_samples(DatasetSpec(path=str(header_only)))


def test_chat_roles_and_content_parts_are_normalised(tmp_path):
    rows = [
        {
            "messages": [
                {"role": "User", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "you"}]},
                {"role": "Assistant", "content": "Hello."},
            ]
        }
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    [sample] = load_samples(DatasetSpec(path=str(path)))
    assert [m["role"] for m in sample.messages] == ["user", "assistant"]
    assert sample.messages[0]["content"] == "Hi you"


def test_broken_tokenizer_folder_is_one_line(tiny_model, tmp_path):
    import shutil

    from sweeper.data import load_tokenizer
    from sweeper.errors import ModelError

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError) as info:
        load_tokenizer(str(broken))
    [line] = info.value.problems
    assert line.startswith(f"{broken}: model.name_or_path: cannot load its tokenizer")
