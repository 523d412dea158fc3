"""A trial's instruments (sweeper.trial._child.instruments): a new one is a ``TrainerCallback`` in a module of its
own joined by one call, and its part of the result reaches the stored result without any other file knowing it; the
list runs in the order the stored figures need."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: A toy instrument, written as a new figure would be (its own module: here the script), joined by one call, run in
#: a trial process of its own (the script is one: it runs the trial in-process, as the worker does). It counts the
#: constant phase's optimizer steps inside its own "instrument running" state, watches the 4-bit layers' activations
#: of its own forward (one forward of the probe's first batch), and writes its part under ``experimental``.
_TOY = """
import json, sys
from pathlib import Path

import torch

from sweeper.testing import tiny_trial_config
from sweeper.trial._child import worker
from sweeper.trial._child.instruments import Instrument, register_instrument


class StepCounter(Instrument):
    name = "toy_steps"
    undone = True  # its seconds are not the training's

    def __init__(self):
        super().__init__()
        self.steps, self.running_seen = 0, []

    def on_step_end(self, args, state, control, **kwargs):
        if self.record.stressing:
            return
        with self.running():
            self.steps += 1
            self.running_seen.append(self.record.running is self)

    def write(self, result, config):
        result.experimental[self.name] = {
            "steps": self.steps, "running_seen": self.running_seen, "time_s": self.time_s,
            "after": self.record.running is None,
        }


register_instrument(StepCounter)
config = tiny_trial_config(Path(sys.argv[1]), max_steps=3, bnb_4bit_compute_dtype="bfloat16")
result = worker.run(config, sys.argv[1], Path(sys.argv[2]))
print(json.dumps(result.to_dict()))
"""


@pytest.mark.slow
def test_a_new_instrument_is_one_module_and_one_call_and_its_part_is_stored(tiny_model, tmp_path):
    tmp_path.joinpath("t").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _TOY, str(tiny_model), str(tmp_path / "t")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads(done.stdout.strip().splitlines()[-1])
    assert stored["status"] == "complete", stored["reason"]
    toy = stored["experimental"]["toy_steps"]
    # It ran at each constant-phase step, in its own running state, restored after it; the stress phase's steps
    # (after the constant phase) are not its.
    assert toy["steps"] == 3 and toy["running_seen"] == [True, True, True] and toy["after"] is True
    assert toy["time_s"] >= 0
    # The built-in figures are all there beside it, in the stable stored names.
    assert stored["stability_margin"] is not None and len(stored["probe_steps"]) >= 2
    assert stored["worst_case_shape"] is not None


def test_the_instruments_run_in_the_order_their_figures_need():
    """The cap check before the step's traces (an OOM at a step is that step's), the traces before the worst-case
    step and the probe (they read the finished step), the probe before the stress phase (its last constant probe
    comes before the first stress step) and before the line search (which reads the probe's rows)."""
    pytest.importorskip("transformers")
    from sweeper.trial._child.instruments import INSTRUMENTS, register_instrument
    from sweeper.trial._child.instruments.probe import ProbeInstrument

    names = [kind.name for kind in INSTRUMENTS]
    assert names == ["phase_memory", "traces", "worst_case", "probe", "stress", "critical_lr"]
    with pytest.raises(ValueError, match="already registered"):
        register_instrument(ProbeInstrument)
