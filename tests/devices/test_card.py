"""``memory_limit_gib: auto``: the device read from the machine (:mod:`sweeper.devices._card`), the space that keeps
the word until the device is read, and the cap it stands for."""

from __future__ import annotations

import json
import os

import pytest

from sweeper.devices import Card, CardError, cuda_visible, read_cards, smallest_card
from sweeper.errors import SpaceError


def test_auto_is_the_card_less_its_reserve_rounded_down():
    card = Card(device="cuda", name="NVIDIA GeForce RTX 4090", total_memory_gib=23.6489)
    assert card.auto_memory_limit_gib == 23.14  # 23.6489 - 0.5, down to 0.01 GiB
    assert Card(device="cpu", name="this machine", total_memory_gib=8.0).auto_memory_limit_gib == 7.0
    with pytest.raises(ValueError, match="no more than the 0.5 GiB auto keeps free"):
        _ = Card(device="cuda", name="tiny", total_memory_gib=0.4).auto_memory_limit_gib
    l4 = Card(device="cuda", name="NVIDIA L4", total_memory_gib=22.16)
    assert smallest_card([card, l4]) is l4


def test_this_machine_is_its_physical_memory_and_what_is_in_use():
    # checked against another reader of the kernel's figures (sysinfo(2), through os.sysconf), not a re-derivation
    # of the parse under test (issue 56)
    import os

    (card,) = read_cards("cpu")
    physical_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert card.device == "cpu" and abs(card.total_memory_gib - physical_gib) < 0.01, (card, physical_gib)
    free_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**30  # free, a lower bound of available
    assert card.in_use_gib is not None and 0 < card.in_use_gib <= card.total_memory_gib - free_gib + 0.5


@pytest.mark.skipif(cuda_visible(), reason="a CUDA driver is here: the GPU check reads the card")
def test_no_card_is_one_error_without_starting_a_process():
    with pytest.raises(CardError, match="no CUDA device is visible here"):
        read_cards("cuda")


def test_the_space_keeps_auto_until_the_device_is_read(tmp_path):
    from sweeper.space import load_space
    from sweeper.testing import tiny_space, write_space

    space = load_space(write_space(tmp_path, tiny_space("TINY", training={"memory_limit_gib": "auto"})))
    assert space.memory_limit_auto
    assert space.with_memory_limit(7.25).base.memory_limit_gib == 7.25
    assert space.with_memory_limit(7.25).memory_limit_auto
    with pytest.raises(SpaceError) as bad:
        load_space(write_space(tmp_path, tiny_space("TINY", training={"memory_limit_gib": "card"})))
    assert bad.value.problems == [
        f"{tmp_path / 'space.yaml'}: training.memory_limit_gib: 'card' is not valid; give a number > 0 and <= 65536, "
        "or auto (the card's own size)"
    ]


def test_estimate_on_the_cpu_prints_this_machine_beside_the_cap(tiny_model, tmp_path):
    from sweeper.testing import run_cli, tiny_space, write_space

    path = write_space(tmp_path, tiny_space(tiny_model, training={"memory_limit_gib": "auto"}))
    out = run_cli("estimate", str(path), "--device", "cpu", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (card,) = read_cards("cpu")
    cap = card.auto_memory_limit_gib
    assert (
        f"memory_limit_gib={cap:g} (cap {cap:g} GiB (auto) of this machine's {card.total_memory_gib:.2f} GiB)"
        in (out.stdout.splitlines()[0])
    )
    over = run_cli("estimate", str(path), "--device", "cpu", "--set", "memory_limit_gib=4096", cwd=tmp_path)
    assert over.returncode == 0 and "WARNING memory: the cap (4096 GiB) is more than this machine's" in over.stdout


def test_the_trials_allocator_options_keep_the_environments_others_and_say_what_they_override(
    tiny_model, tmp_path, monkeypatch
):
    # issue 57: expandable_segments is a training key; the trial process replaces only that option of the
    # environment's PYTORCH_CUDA_ALLOC_CONF, and the sweep says where that overrides the environment (on CUDA) or
    # where searching it measures nothing (on the CPU)
    from sweeper.devices import cuda_alloc_conf, environment_expandable_segments
    from sweeper.space import load_space
    from sweeper.sweep._cards import with_card
    from sweeper.testing import tiny_space, write_space

    assert cuda_alloc_conf(None, False) == "" and cuda_alloc_conf("", True) == "expandable_segments:True"
    assert cuda_alloc_conf("max_split_size_mb:128, expandable_segments:False", True) == (
        "max_split_size_mb:128,expandable_segments:True"
    )
    assert cuda_alloc_conf("expandable_segments:True,garbage_collection_threshold:0.6", False) == (
        "garbage_collection_threshold:0.6"
    )
    assert environment_expandable_segments({}) is None
    assert environment_expandable_segments({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}) is None
    assert environment_expandable_segments({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}) == "True"

    searched = load_space(write_space(tmp_path, tiny_space(tiny_model, search={"expandable_segments": [False, True]})))
    assert [t.expandable_segments for t in (searched.trial_config({"expandable_segments": True}),)] == [True]
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    _, _, said = with_card(searched, "cpu")
    assert [w for w in said if "expandable_segments" in w] == [
        f"WARNING memory: {searched.path}: search: expandable_segments is a CUDA allocator setting; on the CPU it "
        "moves nothing, so its values measure the same (each trial records it as not applicable, and a "
        "configuration that differs only in it is a repeat of the one measured)"
    ]
    fixed = load_space(write_space(tmp_path, tiny_space(tiny_model), name="fixed.yaml"))
    assert not [w for w in with_card(fixed, "cpu")[2] if "expandable_segments" in w]
    # issue 68: the user's own allocator options, under either of torch's names, are said to reach no CPU trial
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:128")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")
    [note] = [w for w in with_card(fixed, "cpu")[2] if "allocator" in w]
    assert note.startswith(
        "note    the environment gives the CUDA allocator garbage_collection_threshold:0.6,expandable_segments:False,"
        "max_split_size_mb:128 (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF): it moves nothing on the CPU"
    )
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    said = [w for w in with_card(fixed, "cuda")[2] if "expandable_segments" in w]
    assert said == [
        "WARNING memory: the environment gives the CUDA allocator expandable_segments:True, but each trial runs "
        f"under the space's expandable_segments (false); set it in {fixed.path} (training: expandable_segments: "
        "true) to measure with it"
    ]


def test_auto_keeps_the_cuda_context_as_read_where_it_is_more_than_the_default(tmp_path):
    # issue 57: the card reader measures its own context (the driver's count after, less before, by the card's UUID);
    # auto keeps that free where it is more than the 0.5 GiB default, rounded up to 0.05 GiB
    import os
    import subprocess
    import sys

    from sweeper.devices._card import _READ_CUDA, CUDA_RESERVE_GIB

    card = Card(device="cuda", name="RTX 5090", total_memory_gib=31.36, context_gib=0.62)
    assert card.reserve_gib == 0.65 and card.auto_memory_limit_gib == 30.71
    small = Card(device="cuda", name="RTX A2000", total_memory_gib=11.76, context_gib=0.13)
    unread = Card(device="cuda", name="H200", total_memory_gib=139.8)
    assert small.reserve_gib == unread.reserve_gib == CUDA_RESERVE_GIB
    # The driver's counts, read by UUID: a stand-in nvidia-smi (no GPU here) prints what the real one prints
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU-8a1c-Ff, 1535'\necho 'GPU-77, [N/A]'\n")
    fake.chmod(0o755)
    head = _READ_CUDA[: _READ_CUDA.index("out = []")] + "print(json.dumps(before))"
    done = subprocess.run(
        [sys.executable, "-c", head],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == {"8a1c-ff": 1535 * 2**20}


def test_the_trials_allocator_keeps_the_options_given_under_either_name(monkeypatch):
    # torch reads PYTORCH_CUDA_ALLOC_CONF or its newer name PYTORCH_ALLOC_CONF, which first depends on its version:
    # the trial process composes the options of both with its own expandable_segments and writes the result under
    # both, so an option given under either name is neither dropped nor left out of the recorded cuda_alloc_conf.
    from sweeper.devices import environment_alloc_conf
    from sweeper.trial._child.memory import set_cuda_allocator

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:False")
    assert set_cuda_allocator(True) == "max_split_size_mb:64,expandable_segments:True"
    assert (
        os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        == os.environ["PYTORCH_ALLOC_CONF"]
        == ("max_split_size_mb:64,expandable_segments:True")
    )
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    assert set_cuda_allocator(False) == "max_split_size_mb:64,garbage_collection_threshold:0.6"
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert set_cuda_allocator(False) == "" and "PYTORCH_ALLOC_CONF" not in os.environ
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    assert environment_alloc_conf({"PYTORCH_ALLOC_CONF": "a:1,b:2", "PYTORCH_CUDA_ALLOC_CONF": "b:3"}) == "a:1,b:3"
