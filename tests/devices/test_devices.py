"""Which CPU computes bfloat16 fast, read from ``/proc/cpuinfo``, and the note ``sweep run`` prints on one that does
not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeper.cli._setup_text import _slow_on_this_cpu
from sweeper.devices import cpu_has_bfloat16
from sweeper.space import load_space

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
DEMO = Path(__file__).parents[2] / "search_spaces" / "demo.yaml"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [(AVX2, False), (SAPPHIRE_RAPIDS, True), (GRAVITON3, True), ("", None), ("processor\t: 0\n", None)],
)
def test_bfloat16_instructions_are_read_from_cpuinfo(tmp_path, text, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert cpu_has_bfloat16(cpuinfo) is expected


def test_an_unreadable_cpuinfo_claims_nothing(tmp_path):
    assert cpu_has_bfloat16(tmp_path / "absent") is None


# Stand-in: the note depends on the CPU and on a GPU driver, which a test cannot change, so both answers are
# replaced here (the parsing above runs on real cpuinfo text).
@pytest.fixture
def cpu_without_bfloat16(monkeypatch):
    monkeypatch.setattr("sweeper.devices.cuda_visible", lambda: False)
    monkeypatch.setattr("sweeper.devices.cpu_has_bfloat16", lambda: False)


@pytest.fixture
def bfloat16_space(tmp_path) -> str:
    """The demo's space searching ``bnb_4bit_compute_dtype`` over bfloat16 and float32 (the demo fixes float32)."""
    raw = yaml.safe_load(DEMO.read_text())
    del raw["training"]["bnb_4bit_compute_dtype"]
    raw["search"]["bnb_4bit_compute_dtype"] = ["bfloat16", "float32"]
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_a_bfloat16_space_on_a_cpu_without_it_is_told_how_to_sweep_quickly(cpu_without_bfloat16, bfloat16_space):
    note = _slow_on_this_cpu(load_space(bfloat16_space))
    assert note is not None and "bfloat16 trials run several times slower" in note
    assert note.endswith(f"sweep run {bfloat16_space} --set bnb_4bit_compute_dtype=float32")
    # the user's own --set of the dtype is replaced, not repeated (a key set twice is refused)
    pinned = load_space(bfloat16_space, ["bnb_4bit_compute_dtype=bfloat16"])
    assert _slow_on_this_cpu(pinned).endswith(": --set bnb_4bit_compute_dtype=float32")
    # a float32 space (the demo's) has nothing to say
    assert _slow_on_this_cpu(load_space(bfloat16_space, ["bnb_4bit_compute_dtype=float32"])) is None
    assert _slow_on_this_cpu(load_space(DEMO)) is None


def test_no_note_where_bfloat16_is_fast_or_unknown(monkeypatch, bfloat16_space):
    space = load_space(bfloat16_space)
    monkeypatch.setattr("sweeper.devices.cuda_visible", lambda: False)
    for answer in (True, None):
        monkeypatch.setattr("sweeper.devices.cpu_has_bfloat16", lambda answer=answer: answer)
        assert _slow_on_this_cpu(space) is None
