"""Whether any configuration of a space fits its cap before a sweep starts: the memory model corrected by what the
study measured, and on the CPU the smallest configuration measured for two steps (the model's error there is about
2x); the one line that says what would fit."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable

import optuna

from sweeper.devices import device_kind
from sweeper.memory import nothing_fits, smallest_predicted
from sweeper.space import SearchSpace, TrialConfig
from sweeper.study import store_baseline, stored_calibration
from sweeper.sweep._preflight import known_memory, trial_device
from sweeper.trial import TrialStatus

#: On the CPU, a cap within this factor of the smallest predicted peak is measured before the first trial: the
#: uncorrected model under-predicted the built-in model's trials by up to 1.7x (0.66 GiB predicted, 1.1 measured), so
#: a cap between the two OOMed every trial (issue 30's case).
CPU_MODEL_ERROR = 2.0


def nothing_fits_line(
    space: SearchSpace,
    raw: Callable[[TrialConfig], float | None],
    study: optuna.Study,
    model_path: str,
    on_measure: Callable[[str], None] | None = None,
) -> str | None:
    """One line when no configuration of the space is predicted to fit its cap, by the memory model corrected with
    what the study measured on this kind of machine (:func:`sweeper.memory.nothing_fits`); None when something does,
    or the study already holds a trial that fit under a cap no larger than this run's (a fit under a larger cap, before
    a resume with a smaller ``memory_limit_gib``, says nothing about this one).

    On the CPU, while the study has no correction and no trial that fit, a cap within :data:`CPU_MODEL_ERROR` of the
    smallest predicted peak is checked first: the smallest configuration runs two steps (:func:`measure_smallest`,
    printed through ``on_measure``), and the difference is stored as the study's correction
    (:func:`sweeper.study._calibration.store_baseline`), which the preflight of every trial then applies, until the
    first complete trial's fit replaces it. The advice stands on that measurement too: there the cap binds while the
    model loads, and the process's resident memory (Python and its libraries, the loaded checkpoint) is larger than
    the model's constant for some models (measured on the built-in model: 0.91 GiB while loading, 0.85 GiB training,
    against 0.70 GiB predicted)."""
    kind = device_kind()
    calibration = stored_calibration(study, kind)
    limit_gib = space.base.memory_limit_gib
    known = known_memory(study, kind)
    cpu = trial_device() == "cpu"
    measure = _MeasuredOnce(raw, model_path, on_measure)

    if cpu and calibration is None and not any(k.fits for k in known):
        smallest = smallest_predicted(space, raw)
        # the prediction is within the model's CPU error of the cap, either side: measure (one far above it, e.g.
        # 684 GiB at a 2.5 GiB cap, is the nothing-fits line's at once and is never measured)
        if smallest is not None and limit_gib / CPU_MODEL_ERROR <= smallest[0] <= limit_gib * CPU_MODEL_ERROR:
            got = measure(smallest[1], f"the cap is within the CPU memory model's error ({CPU_MODEL_ERROR:g}x) of "
                          f"the smallest predicted peak ({smallest[0]:.2f} GiB)")  # fmt: skip
            if got is not None:
                calibration = store_baseline(study, smallest[1], smallest[0], max(got), kind)
                if on_measure is not None:
                    on_measure(
                        f"memory  measured {max(got):.2f} GiB (loading {got[0]:.2f} GiB) where the model said "
                        f"{smallest[0]:.2f}: the preflight adds the difference until a trial completes"
                    )

    def predict(config: TrialConfig) -> float | None:
        peak = raw(config)
        return calibration.correct(config, peak) if calibration is not None and peak is not None else peak

    def advise(config: TrialConfig) -> tuple[float, float] | None:
        return measure(config, "nothing is predicted to fit; so that the advice holds")

    fit = any(k.fits and k.config.memory_limit_gib <= limit_gib for k in known)
    return nothing_fits(space, predict, known_fit=fit, measure=advise if cpu else None)


class _MeasuredOnce:
    """The smallest configuration's two-step measurement (:func:`measure_smallest`), made at most once a sweep and
    reused: ``measure(config, why)`` runs it under :data:`CPU_MODEL_ERROR` times ``raw(config)`` (GiB), saying why
    and what came of it through ``on_measure``, unless that is more than this machine has free; returns
    ``(loading, training)`` peaks in GiB, or None (not measured, or it did not complete two steps)."""

    def __init__(
        self,
        raw: Callable[[TrialConfig], float | None],
        model_path: str,
        on_measure: Callable[[str], None] | None,
    ) -> None:
        self.raw, self.model_path = raw, model_path
        self.say = on_measure or (lambda line: None)
        self.done = False
        self.got: tuple[float, float] | None = None

    def __call__(self, config: TrialConfig, why: str) -> tuple[float, float] | None:
        if self.done:
            return self.got
        self.done = True
        predicted = self.raw(config)
        room = machine_available_gib()
        if predicted is None or predicted * CPU_MODEL_ERROR > room:
            # a configuration the model puts beyond what this machine has free is not run to learn its size
            if predicted is not None:
                self.say(
                    f"memory  {why}; the smallest configuration is predicted at {predicted:.2f} GiB, and up to "
                    f"{CPU_MODEL_ERROR:g}x that is more than this machine has free ({room:.2f} GiB): not "
                    "measured, the advice below is the memory model's"
                )
            return None
        cap_gib = predicted * CPU_MODEL_ERROR
        self.say(
            f"memory  {why}; measuring the smallest configuration once (two steps, under {cap_gib:.2f} GiB: "
            f"{CPU_MODEL_ERROR:g}x its prediction)"
        )
        self.got = measure_smallest(config, self.model_path, cap_gib)
        if self.got is None:
            self.say(
                f"memory  the measurement did not complete two steps under {cap_gib:.2f} GiB: the smallest "
                "configuration needs more than that here; the advice below is the memory model's"
            )
        return self.got


def machine_available_gib() -> float:
    """What this machine has free for a measurement, in GiB: its card's size less what is in use (``MemTotal`` and
    ``MemAvailable``, read once, by :func:`sweeper.devices.read_cards`; its physical memory where there is no
    ``/proc/meminfo``)."""
    from sweeper.devices import read_cards

    [machine] = read_cards("cpu")
    return machine.total_memory_gib - (machine.in_use_gib or 0.0)


def measure_smallest(config: TrialConfig, model_path: str, cap_gib: float | None = None) -> tuple[float, float] | None:
    """Run ``config`` for two steps without the stress phase, capped at ``cap_gib`` (default: what the machine has
    free), in a fresh trial process: ``(load_peak_memory_gib, peak_memory_gib)``, or None when it did not complete
    them. Two, not one: the optimizer allocates its states in the first step's update, so only the second step's
    backward runs beside them (advice from one step ran out of memory in step 2's backward at 0.63 GiB:
    tests/sweep/test_setup_checks.py)."""
    from sweeper.trial import Measures, run_trial

    cap = min(cap_gib if cap_gib is not None else math.inf, machine_available_gib())
    two = dataclasses.replace(config, max_steps=2, warmup_steps=0, memory_limit_gib=cap, trial_timeout_s=600.0)
    with tempfile.TemporaryDirectory(prefix="sweeper-measure-") as folder:
        result = run_trial(two, folder, model_path=model_path, measures=Measures(stress=None))
    if (
        result.memory.peak_memory_gib is None
        or result.memory.load_peak_memory_gib is None
        or result.status != TrialStatus.COMPLETE
    ):
        return None
    return result.memory.load_peak_memory_gib, result.memory.peak_memory_gib
