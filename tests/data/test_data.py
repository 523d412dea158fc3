"""Datasets a user brings (four formats, four file types, auto-detected), the built-in corpus, and the loss mask."""

import json

import pytest

from sweeper.data import load_samples, tokenize_samples
from sweeper.data._formats import detect_format
from sweeper.data._load import BUILTIN_PYDOC
from sweeper.errors import DataError
from sweeper.space import DatasetSpec
from sweeper.testing import GENERATION_CHATML, write_jsonl

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


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("latin1.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9 au lait"}\n'),
        ("latin1.csv", b"text\nok\ncaf\xe9 au lait\n"),
        ("latin1.json", b'[{"text": "ok"}, {"text": "caf\xe9"}]'),
    ],
)
def test_a_file_that_is_not_utf8_is_one_line_naming_the_line(tmp_path, name, content):
    # JSON lines in latin-1 were a 46-line UnicodeDecodeError traceback from pyarrow (issue 48); the same bytes as
    # CSV were one line without the line number
    bad = tmp_path / name
    bad.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_samples(DatasetSpec(path=str(bad)))
    rows = content.split(b"\n")
    line = next(n for n, row in enumerate(rows, 1) if b"\xe9" in row)
    column = rows[line - 1].index(b"\xe9") + 1
    assert info.value.problems == [
        f"{bad}: dataset.path: line {line} (byte 0xe9 at column {column}) is not UTF-8; save the file as UTF-8 (e.g. "
        "iconv -f latin1 -t utf-8), or fix that line"
    ]


def test_unreadable_files_name_the_cause(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DataError) as info:
        load_samples(DatasetSpec(path=str(bad)))
    [line] = info.value.problems
    assert line.startswith(f"{bad}: dataset.path: cannot read it as json (line 2: ") and line.endswith("fix that line")
    bad.write_text('{"text": "ok"}\n{"text": "fine"}\n[1, 2, 3]\n')  # valid JSON, not a sample: the line is named too
    with pytest.raises(DataError, match=r"\(line 3: a JSON list, not an object"):
        load_samples(DatasetSpec(path=str(bad)))
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


# --- The loss mask: exactly the replies and the end of their turns, in every template case -------------------------


@pytest.fixture(scope="module")
def smollm2():
    """The built-in model's tokenizer (SmolLM2's template injects a default system prompt)."""
    from sweeper.data import load_tokenizer
    from sweeper.model import resolve_model
    from sweeper.space import ModelSpec

    return load_tokenizer(resolve_model(ModelSpec()))


def _chat(*turns: tuple[str, str], completion: bool = False):
    from sweeper.data import Sample

    return Sample(index=0, messages=tuple({"role": r, "content": c} for r, c in turns), completion=completion)


def _trained(sample, tokenizer) -> tuple[list[int], str]:
    """``(input_ids, the supervised text)`` of one sample at full length."""
    [tok] = tokenize_samples([sample], tokenizer, max_seq_length=10**6)
    return tok.input_ids, tokenizer.decode([t for t in tok.labels if t != -100])


@pytest.mark.parametrize(
    ("turns", "supervised"),
    [
        ((("assistant", "Hi."),), "Hi.<|im_end|>\n"),  # the example: 4 tokens, not 28
        ((("system", "Be brief."), ("assistant", "Hi.")), "Hi.<|im_end|>\n"),
        ((("user", "Yo"), ("assistant", "Hi."), ("assistant", "Again.")), "Hi.<|im_end|>\nAgain.<|im_end|>\n"),
        ((("user", "Yo"), ("assistant", "")), "<|im_end|>\n"),
        ((("assistant", "A"), ("user", "B"), ("assistant", "C")), "A<|im_end|>\nC<|im_end|>\n"),
    ],
)
def test_smollm2_supervises_replies_not_the_default_system_prompt(smollm2, turns, supervised):
    ids, text = _trained(_chat(*turns), smollm2)
    assert text == supervised
    if turns == (("assistant", "Hi."),):
        [tok] = tokenize_samples([_chat(*turns)], smollm2, max_seq_length=10**6)
        assert sum(1 for t in tok.labels[1:] if t != -100) == 4
        assert "You are a helpful AI assistant" in smollm2.decode(ids)  # trained on as context, not as target


def test_text_rows_and_completions_end_with_eos_as_trl_writes_them(smollm2, tmp_path):
    from sweeper.audit._lengths import supervised_tokens

    [tok] = tokenize_samples(
        load_samples(
            DatasetSpec(path=str(_rows(tmp_path, [{"text": "The quick brown fox jumps over the lazy dog."}])))
        ),
        smollm2,
        max_seq_length=10**6,
    )
    assert len(tok.input_ids) == 11 and supervised_tokens(tok.labels, 10**6) == 10
    assert tok.input_ids[-1] == smollm2.eos_token_id
    # Already ending with it: not twice (TRL checks endswith too).
    [again] = tokenize_samples(
        load_samples(DatasetSpec(path=str(_rows(tmp_path, [{"text": "Done.<|im_end|>"}])))), smollm2, 10**6
    )
    assert again.input_ids.count(smollm2.eos_token_id) == 1
    # SmolLM2's end of turn is its EOS: a completion ends with it once.
    [pc] = load_samples(DatasetSpec(path=str(_rows(tmp_path, [{"prompt": "2+2?", "completion": "4."}]))))
    assert pc.completion
    assert _trained(pc, smollm2)[1] == "4.<|im_end|>\n"


def test_completions_get_eos_when_the_end_of_turn_is_not_eos(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    for row in ({"prompt": "2+2?", "completion": "4."}, {"instruction": "Add", "input": "2+2", "output": "4."}):
        [sample] = load_samples(DatasetSpec(path=str(_rows(tmp_path, [row]))))
        ids, text = _trained(sample, tokenizer)
        assert text == "4.\n<|im_end|>" and ids[-1] == tokenizer.eos_token_id
    # A chat row is conversational: the template decides (TRL adds no EOS to conversations either).
    assert _trained(_chat(("user", "2+2?"), ("assistant", "4.")), tokenizer)[1] == "4.\n"


#: Llama-3-like: a header per turn, contents trimmed, an end-of-turn marker, a default system turn.
LLAMA3_LIKE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<|start|>system<|end|>\n\nDefault.<|eot|>{% endif %}"
    "{% for m in messages %}<|start|>{{ m['role'] }}<|end|>\n\n{{ m['content'] | trim }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|end|>\n\n{% endif %}"
)
#: Not prefix-stable: the last turn is marked, so a conversation cut after an earlier reply renders differently.
LAST_MARKED = (
    "{% for m in messages %}{% if loop.last %}[final] {% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}"
)
CASES = [
    (("assistant", "Hi."),),
    (("system", "Be brief."), ("assistant", "Hi.")),
    (("user", "Yo"), ("assistant", "Hi."), ("assistant", "Again.")),
    (("user", "Yo"), ("assistant", "")),
    (("system", "S"), ("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")),
]


@pytest.mark.parametrize("turns", CASES)
def test_generation_markers_agree_with_our_mask(tiny_model, turns):
    from transformers import AutoTokenizer

    from sweeper.data._tokenize import assistant_masks

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = GENERATION_CHATML
    ids, ours, theirs = assistant_masks(_chat(*turns), tokenizer)
    assert theirs is not None and ours == theirs and len(ids) == len(ours)
    replies = "".join(f"{c}<|im_end|>\n" for r, c in turns if r == "assistant")
    assert _trained(_chat(*turns), tokenizer)[1] == replies


@pytest.mark.parametrize("turns", CASES)
@pytest.mark.parametrize("template", [LLAMA3_LIKE, LAST_MARKED])
def test_other_templates_supervise_contents_and_end_of_turn_only(tiny_model, turns, template):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|start|>", "<|end|>", "<|eot|>"]})
    tokenizer.chat_template = template
    end = "<|eot|>" if template is LLAMA3_LIKE else "<|im_end|>\n"
    replies = "".join(f"{c}{end}" for r, c in turns if r == "assistant")
    assert _trained(_chat(*turns), tokenizer)[1] == replies


def test_rows_the_template_refuses_are_counted_not_trained(tiny_model):
    from transformers import AutoTokenizer

    from sweeper.data import DroppedRow, Sample, unused_rows

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    good = Sample(index=0, messages=({"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}))
    bad = Sample(index=1, messages=({"role": "assistant", "content": "A"},))
    dropped: list = []
    tokenized = tokenize_samples([good, bad], tokenizer, 64, dropped=dropped)
    assert [t.index for t in tokenized] == [0]
    reason = "the chat template refuses it (Conversation roles must alternate user/assistant)"
    assert dropped == [DroppedRow(1, reason)] == unused_rows([good, bad], tokenizer)


# --- ShareGPT, and no row left out silently ------------------------------------------------------------------------


def _rows(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "2+2?"},
        {"from": "gpt", "value": "4."},
    ]
}


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        (SHAREGPT, "auto"),
        (SHAREGPT, "sharegpt"),
        ({"messages": SHAREGPT["conversations"]}, "auto"),  # the case: from/value under 'messages'
        ({"messages": SHAREGPT["conversations"]}, "sharegpt"),
        (
            {
                "messages": [{"role": "human", "content": "2+2?"}, {"role": "gpt", "content": "4."}],
                "system": "Be brief.",
            },
            "chat",
        ),
        ({"conversations": SHAREGPT["conversations"][1:], "system": "Be brief."}, "auto"),  # LLaMA-Factory's column
    ],
)
def test_sharegpt_is_read_as_axolotl_and_llama_factory_read_it(tmp_path, row, fmt):
    samples = load_samples(DatasetSpec(path=str(_rows(tmp_path, [row])), format=fmt))
    assert [dict(m) for m in samples[0].messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."},
    ]
    assert samples.dropped == [] and samples.rows == 1


def test_sharegpt_format_is_detected_and_declared():
    from sweeper.space._schema import DATA_FORMATS

    assert detect_format(["conversations", "id"]) == "sharegpt" and "sharegpt" in DATA_FORMATS


def test_every_row_not_used_is_counted_with_its_reason(tmp_path):
    from sweeper.data import DroppedRow, describe_dropped

    good = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}
    half = {"messages": [{"role": "human", "content": "Q"}, {"role": "gpt", "content": "A"}]}
    rows = [good, half] * 30  # the file: 30 rows of each, all 60 are read now
    rows += [
        {"messages": [{"role": "system", "content": "only a system turn"}]},
        {"messages": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": "f()"}]},
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"messages": None},
    ]
    samples = load_samples(DatasetSpec(path=str(_rows(tmp_path, rows)), max_samples=10**6))
    assert len(samples) == 60 and samples.rows == 65
    assert samples.dropped == [
        DroppedRow(60, "no assistant turn"),
        DroppedRow(61, "unknown role 'function_call'"),
        DroppedRow(62, "empty conversation"),
        DroppedRow(63, "a turn without role/content (or from/value)"),
        DroppedRow(64, "no list of turns in 'messages' or 'conversations'"),
    ]
    assert describe_dropped([DroppedRow(i, "empty text") for i in range(7)] + [DroppedRow(9, "x")]) == (
        "7 rows: empty text (rows 0, 1, 2, 3, 4 and 2 more); 1 row: x (row 9)"
    )
    with pytest.raises(DataError, match=r"no usable rows: 2 rows: empty text \(rows 0, 1\)"):
        load_samples(DatasetSpec(path=str(_rows(tmp_path, [{"text": " "}, {"text": ""}], "blank.jsonl"))))


def test_a_row_of_another_format_is_named_as_such_not_as_empty(tmp_path):
    """A file mixing text and prompt/completion rows is read as prompt_completion (its columns); each text row is
    dropped as a text row in that file, not as an 'empty prompt and completion'."""
    from sweeper.data import DroppedRow

    rows = [{"prompt": "Q", "completion": "A"}, {"text": "Free text."}, {"prompt": "", "completion": ""}]
    samples = load_samples(DatasetSpec(path=str(_rows(tmp_path, rows))))
    assert len(samples) == 1 and samples.dropped == [
        DroppedRow(
            1, "a text row in a prompt_completion dataset (one format per file: split the file, or set dataset.format)"
        ),
        DroppedRow(2, "empty prompt and completion"),
    ]
    chat = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "text": "x"}
    assert len(load_samples(DatasetSpec(path=str(_rows(tmp_path, [chat], "t.jsonl")), format="text"))) == 1


def test_content_that_is_not_text_drops_its_row_with_the_reason(tmp_path):
    """Non-text content was trained as its JSON text, and null content (a tool-call turn) as an empty reply; a number
    was trained as its digits with no finding (issue 68), though this says a turn that is not text is counted."""

    def chat(reply, **extra):
        return {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": reply, **extra}]}

    rows = [
        chat("fine"),
        chat([{"type": "image", "url": "x.png"}, {"type": "text", "text": "a cat"}]),
        chat(None),
        chat(None, tool_calls=[{"type": "function", "function": {"name": "f", "arguments": "{}"}}]),
        chat(42),
    ]
    for i, row in enumerate(rows):  # one file each: a table cannot hold these types in one column
        path = _rows(tmp_path, [rows[0], row], f"r{i}.jsonl")
        got = load_samples(DatasetSpec(path=str(path), max_samples=10))
        assert got.rows == 2, i
        if i == 0:
            assert not got.dropped and {s.messages[1]["content"] for s in got} == {"fine"}
        else:
            [dropped] = got.dropped
            assert dropped.index == 1, i
            assert (
                dropped.reason
                == {
                    1: "a turn whose content is not text (parts: image, text)",
                    2: "a turn whose content is null",
                    3: "a turn with tool_calls (only text turns are read; it would train as empty)",
                    4: "a turn whose content is a number (42), not text; write it as a string",
                }[i]
            )


def test_turns_spelled_both_ways_in_one_file_are_read(tmp_path):
    """role/content in one row and from/value in another: the table gives every turn all four keys, null where a
    turn has none; each turn is read by the spelling it has."""
    rows = [
        {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}]},
        {"messages": [{"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]},
    ]
    samples = load_samples(DatasetSpec(path=str(_rows(tmp_path, rows)), max_samples=10))
    assert not samples.dropped
    assert sorted(s.messages[1]["content"] for s in samples) == ["A1", "A2"]


#: ChatML whose {% generation %} markers also cover the assistant header: not what sweeper's spans supervise.
HEADER_MARKED = GENERATION_CHATML.replace(
    "<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}",
    "{% if m['role'] == 'assistant' %}{% generation %}<|im_start|>{{ m['role'] }}\n",
).replace("{% else %}{{ m['content'] }}", "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}")


def test_markers_that_supervise_other_tokens_are_reported_not_settled_silently(tiny_model):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from sweeper.audit._findings import audit_samples
    from sweeper.data import mask_disagreements

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    samples = [_chat(("user", "Yo"), ("assistant", "Hi.")), replace(_chat(("user", "Q"), ("assistant", "A.")), index=1)]
    tokenizer.chat_template = GENERATION_CHATML
    assert mask_disagreements(samples, tokenizer) == []
    tokenizer.chat_template = HEADER_MARKED
    assert _trained(samples[0], tokenizer)[1] == "<|im_start|>assistant\nHi.<|im_end|>\n"  # what the markers say
    assert mask_disagreements(samples, tokenizer) == [0, 1]
    tokenized = tokenize_samples(samples, tokenizer, 10**6)
    report = audit_samples(samples, tokenized, [64], mask_disagreements=mask_disagreements(samples, tokenizer))
    [finding] = [f for f in report.findings if f.kind == "generation_mask"]
    assert "{% generation %} markers" in finding.detail and not finding.nan_risk


def test_auto_takes_the_format_most_rows_have(tmp_path):
    """One stray messages row made a file of 25 text rows a chat file (the columns decided): 25 rows dropped, one
    trained. Each row's own columns decide now, and the stray row is the one dropped."""
    from sweeper.data import DroppedRow

    rows = [{"text": f"Row {i} of plain text."} for i in range(25)]
    rows.insert(3, {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})
    samples = load_samples(DatasetSpec(path=str(_rows(tmp_path, rows)), max_samples=100))
    assert len(samples) == 25 and all(s.text is not None for s in samples)
    assert samples.dropped == [
        DroppedRow(3, "a chat row in a text dataset (one format per file: split the file, or set dataset.format)")
    ]


def test_prompt_completion_rows_as_trl_writes_them(tmp_path):
    """TRL's conversational prompt/completion (lists of turns) was trained as the lists' Python text; null fields
    as empty strings. Now a conversational row is one conversation, and a null or non-text field drops its row."""
    from sweeper.data import DroppedRow

    def load(row, name):
        return load_samples(DatasetSpec(path=str(_rows(tmp_path, [row, {"prompt": "Q", "completion": "A"}], name))))

    conversational = {
        "prompt": [{"role": "user", "content": "2+2?"}],
        "completion": [{"role": "assistant", "content": "4."}],
    }
    got = load(conversational, "conv.jsonl")
    assert not got.dropped
    assert sorted(m["content"] for s in got for m in s.messages) == ["2+2?", "4.", "A", "Q"]
    assert all(len(s.messages) == 2 for s in got)
    for row, reason in [
        ({"prompt": "Q", "completion": None}, "'completion' is null"),
        ({"prompt": None, "completion": "A"}, "'prompt' is null"),
        ({"prompt": "Q", "completion": {"a": 1}}, "'completion' is not text (a dict)"),
        (
            {
                "prompt": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
                "completion": [{"role": "assistant", "content": "B"}],
            },
            "a conversational prompt holding an assistant turn (TRL trains only the completion)",
        ),
    ]:
        got = load(row, "r.jsonl")
        assert got.dropped == [DroppedRow(0, reason)] and len(got) == 1, (row, got.dropped)
    alpaca = [{"instruction": None, "input": "", "output": "A"}, {"instruction": "Q", "input": None, "output": "A"}]
    got = load_samples(DatasetSpec(path=str(_rows(tmp_path, alpaca, "alpaca.jsonl"))))
    assert got.dropped == [DroppedRow(0, "'instruction' is null")] and len(got) == 1  # input is optional


def test_an_empty_reply_is_read_alike_from_jsonl_and_csv(tmp_path):
    """CSV has no null: an empty cell is the empty reply a JSONL file writes as "", not a missing field that drops
    the row; both then train, and the audit flags the empty reply."""
    rows = [
        {"prompt": "What are lists?", "completion": "Ordered collections."},
        {"prompt": "And sets?", "completion": ""},
    ]
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    csv = tmp_path / "d.csv"
    csv.write_text('prompt,completion\n"What are lists?","Ordered collections."\n"And sets?",\n')
    read = {p.suffix: load_samples(DatasetSpec(path=str(p), max_samples=10, seed=0)) for p in (jsonl, csv)}
    assert len(read[".jsonl"]) == len(read[".csv"]) == 2
    assert not read[".csv"].dropped and not read[".jsonl"].dropped
    replies = {s: sorted(x.messages[-1]["content"] for x in read[s]) for s in read}
    assert replies[".csv"] == replies[".jsonl"] == ["", "Ordered collections."]


def test_a_huge_row_is_cut_before_tokenizing_and_keeps_its_first_tokens(tiny_model):
    # One 20 MB row made every trial die of SIGABRT in the tokenizer under its cap, and sweep doctor on a 50 MB row
    # took 106 s and 12.8 GB (issue 48): the text no kept token can reach is cut before tokenizing.
    import sys

    from sweeper.data import Sample, load_tokenizer
    from sweeper.data._tokenize import MIN_CUT_CHARS, _longest_token_chars

    tokenizer = load_tokenizer(str(tiny_model))
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "the",
        "sweep",
        "measures",
        "memory",
    ]
    text = " ".join(words[i % len(words)] for i in range(220_000))  # ~1.2 million characters: past MIN_CUT_CHARS
    chat = Sample(index=1, messages=({"role": "user", "content": "hi"}, {"role": "assistant", "content": text}))
    rows = [Sample(index=0, text=text), chat]
    full = tokenize_samples(rows, tokenizer, sys.maxsize)
    cut = tokenize_samples(rows, tokenizer, 64)
    assert max(2 * 64 * _longest_token_chars(tokenizer), MIN_CUT_CHARS) < len(text)  # it was cut
    for whole, short in zip(full, cut):
        assert short.cut and not whole.cut
        assert short.input_ids == whole.input_ids[:64] and short.labels == whole.labels[:64]  # the kept tokens
        assert 64 < short.n_tokens < whole.n_tokens  # a lower bound of the row's length
    small = tokenize_samples([Sample(index=2, text="a short row")], tokenizer, 64)
    assert not small[0].cut


def test_the_worst_step_of_the_whole_file_at_each_length_batch_and_collation():
    # issue 55: the worst step is the file's, which the exports train, not the max_samples the trials sample.
    from sweeper.data import FileLengths

    file = FileLengths(lengths=((7, 30), (2, 900), (5, 10), (9, 400), (1, 60)), sampled=2, sampled_longest=30)
    assert file.longest == 900 and file.cut
    assert not FileLengths(lengths=((7, 30),), sampled=1, sampled_longest=30).cut
    # padded: the longest samples, one to a row, the longest first; each cut to max_seq_length (ties in file order)
    assert file.worst_step(1024, 2, packing=False) == [[2], [9]]
    assert file.worst_step(64, 3, packing=False) == [[2], [9], [1]]  # 64, 64, 60
    # packed: the whole file packed in the trials' order (greedy, as the trials pack), the fullest rows first:
    # 30+900+10 = 940 | 400+60 = 460 at 1000 tokens; 30 | 900 cut to 500 | 10+400+60 = 470 at 500
    assert file.worst_step(1000, 1, packing=True) == [[7, 2, 5]]
    assert file.worst_step(1000, 5, packing=True) == [[7, 2, 5], [9, 1]]  # two rows: fewer than the batch
    assert file.worst_step(500, 2, packing=True) == [[2], [5, 9, 1]]
    with pytest.raises(ValueError):
        file.worst_step(0, 1, packing=False)
    # What a trial's job names: the file's worst step when the trials sample fewer rows, else none (their own rows).
    assert file.trial_worst_step(1024, 2, packing=False) == [[2], [9]]
    assert FileLengths(lengths=((7, 30),), sampled=1, sampled_longest=30).trial_worst_step(64, 1, False) is None


def test_a_data_path_that_is_there_but_no_regular_file_says_what_it_is(tmp_path):
    # issue 55: a FIFO, /dev/null or a symbolic link loop as the data file was "no such file"
    import os
    import re
    from pathlib import Path

    from sweeper.data import load_samples
    from sweeper.errors import DataError
    from sweeper.space import DatasetSpec

    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing.jsonl")
    for path, what in [
        (tmp_path / "pipe.jsonl", "a named pipe (FIFO), not a regular file"),
        (Path("/dev/null"), "a character device, not a regular file"),
        (tmp_path / "loop.jsonl", "a symbolic link that loops, not a regular file"),
        (tmp_path / "gone.jsonl", f"a symbolic link to {tmp_path / 'missing.jsonl'}, which does not exist"),
        (tmp_path / "absent.jsonl", "no such file"),
    ]:
        with pytest.raises(DataError, match=re.escape(f"{path}: dataset.path: {what}")):
            load_samples(DatasetSpec(path=str(path)))
