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
        # a loop was looked up on the hub and never called a loop (issue 48)
        (lambda d: (d / "loop").symlink_to(d / "loop") or d / "loop", "a symbolic link loop"),
        (lambda d: (d / "dangling").symlink_to(d / "nowhere") or d / "dangling", "a symbolic link to nothing"),
    ],
)
def test_bad_local_models(tmp_path, monkeypatch, make, needle):
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    ref = str(make(tmp_path))
    with pytest.raises(ModelError) as info:
        resolve_model(ModelSpec(name_or_path=ref))
    [line] = info.value.problems
    assert line.startswith(f"{ref}: model.name_or_path: ") and needle in line


def test_unknown_builtin_and_an_uncached_hub_id(monkeypatch):
    with pytest.raises(ModelError, match="unknown built-in"):
        resolve_model(ModelSpec(name_or_path="builtin:llama-7b"))
    # an uncached hub id is refused without asking the hub: nothing is downloaded at run time (issue 48: it asked the
    # hub, and where the hub answered each trial process would have downloaded the model)
    import huggingface_hub

    def no_request(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_request)
    with pytest.raises(ModelError) as info:
        resolve_model(ModelSpec(name_or_path="nobody-has-this/model-xyz"))
    [line] = info.value.problems
    assert "not in the Hugging Face cache (nothing is downloaded at run time)" in line
    assert "huggingface-cli download nobody-has-this/model-xyz" in line


def test_an_unusable_sweeper_cache_is_named(tmp_path, monkeypatch):
    # it was reported as a bad GGUF file of the model (issue 48)
    afile = tmp_path / "a-file"
    afile.write_text("")
    monkeypatch.setenv("SWEEPER_CACHE", str(afile))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelError) as info:
        resolve_model(ModelSpec(name_or_path=str(gguf)))
    [line] = info.value.problems
    assert line.startswith(f"{afile / 'models'}: SWEEPER_CACHE: the folder converted models go to cannot be written")
