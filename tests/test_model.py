"""Where a model comes from: local checkpoints, .gguf files, hub ids; each mistake is one clear ModelError."""

import pytest

from sweeper.errors import ModelError
from sweeper.model import resolve_model
from sweeper.space import ModelSpec


def test_local_checkpoint_resolves(tiny_model):
    assert resolve_model(ModelSpec(name_or_path=str(tiny_model))) == str(tiny_model.resolve())


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: d / "missing", "no such directory"),
        (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", "is a file, not a checkpoint"),
        (lambda d: d, "no config.json"),
        (lambda d: (d / "junk.gguf").write_bytes(b"not a gguf file") and d / "junk.gguf", "cannot read this GGUF"),
    ],
)
def test_bad_local_models(tmp_path, monkeypatch, make, needle):
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    ref = str(make(tmp_path))
    with pytest.raises(ModelError) as info:
        resolve_model(ModelSpec(name_or_path=ref))
    [line] = info.value.problems
    assert line.startswith(f"{ref}: model.name_or_path: ") and needle in line


def test_unknown_builtin_and_unreachable_hub_id(monkeypatch):
    with pytest.raises(ModelError, match="unknown built-in"):
        resolve_model(ModelSpec(name_or_path="builtin:llama-7b"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests; offline mode refuses at once
    with pytest.raises(ModelError, match="not in the Hugging Face cache"):
        resolve_model(ModelSpec(name_or_path="nobody-has-this/model-xyz"))
