"""The lines a command prints about its setup before any trial: the model, the data and the cap with its device,
a CPU that emulates the searched compute dtype, and the dataset rows no trial trains on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper.report import format_cap
from sweeper.report.text import plural
from sweeper.space import SearchSpace
from sweeper.stability import STRESS_GROWTH, STRESS_STEPS, probe_interval_steps

if TYPE_CHECKING:
    from sweeper.audit import DataProfile
    from sweeper.devices import Card


def _describe_setup(space: SearchSpace, model_path: str, n_samples: int, card: Card | None = None) -> str:
    cap = format_cap(
        space.base.memory_limit_gib,
        space.memory_limit_auto,
        card.name if card else None,
        card.total_memory_gib if card else None,
        card.device if card else "cuda",
        given=card is not None and card.given,
    )
    lines = [
        f"model   {space.model.name_or_path}" + (f" ({model_path})" if model_path != space.model.name_or_path else ""),
        f"data    {space.dataset.path}: {n_samples} sample{'s' if n_samples != 1 else ''}",
        f"memory  {cap} per trial. CUDA: allocator cap, peak = max reserved. CPU: cap on private memory "
        "(RLIMIT_DATA) and on each step's resident set, peak = resident set after loading, which also counts shared "
        "libraries (+-0.1 GiB between runs)",
    ]
    steps = min(space.values_of("max_steps"))
    lines.append(
        f"margin  after its {plural(steps, 'constant step')} each trial runs a stress phase: at most {STRESS_STEPS} "
        f"steps at {STRESS_GROWTH:g}x the learning rate each, until its probe diverges; the rate it diverged at over "
        "the trial's is its stability margin (docs/trial.md)"
    )
    batch = min(space.values_of("per_device_train_batch_size"))
    accumulation = min(space.values_of("gradient_accumulation_steps"))
    interval = probe_interval_steps(batch, accumulation)
    if steps < 2 * interval:
        lines.append(
            f"note    max_steps={steps}: the probe (sweeper.stability) is evaluated before the first step and every "
            f"{interval} steps at batch {batch}, and at the last step: the instability sees "
            f"{len(range(interval, steps, interval)) + 1} change(s) of the probe loss, a divergence after step {steps} "
            f"is not seen; NaN and OOM are measured at any length; 'sweep confirm' runs the front's knee longer"
        )
    slow = _slow_on_this_cpu(space)
    if slow:
        lines.append(slow)
    if space.model.trust_remote_code:
        lines.append("WARNING trust_remote_code is on: the checkpoint's own Python code will run")
    return "\n".join(lines)


def _slow_on_this_cpu(space: SearchSpace) -> str | None:
    """A note when trials will run on a CPU without bfloat16 instructions and the space computes in bfloat16 or
    float16 (:func:`sweeper.devices.cpu_has_bfloat16`): those trials run several times slower than float32 ones, which
    a user on such a CPU (most laptops) would otherwise only see as trials killed by ``trial_timeout``."""
    from sweeper.devices import cpu_has_bfloat16, cuda_visible

    half = [d for d in space.values_of("bnb_4bit_compute_dtype") if d in ("bfloat16", "float16")]
    if not half or cuda_visible() or cpu_has_bfloat16() is not False:
        return None
    fix = "--set bnb_4bit_compute_dtype=float32"
    if "training.bnb_4bit_compute_dtype" not in space.overridden:
        fix = f"{space.command('run')} {fix}"
    return (
        f"note    this CPU has no bfloat16 instructions (AVX512-BF16, AMX or Arm BF16): {' and '.join(half)} trials "
        "run several times slower than float32 ones here (a bfloat16 step of the built-in model: 17.7 s against "
        "2.4 s on an AVX2 CPU) and may reach trial_timeout; to sweep the other settings quickly on this machine: "
        f"{fix}"
    )


def _dropped_rows_line(space: SearchSpace, profile: DataProfile) -> str | None:
    """One ``WARNING data:`` line counting the dataset rows no trial will train on, by reason (None when every row
    is used): rows :func:`sweeper.data.load_samples` could not read and rows the chat template refuses
    (``profile.unused``); ``sweep doctor`` lists them by index. The data is checked first
    (:func:`sweeper.sweep.check_data`).

    Raises:
        SpaceError: Data no trial can measure as it says (:func:`sweeper.sweep.check_data`).
    """
    from sweeper.data import dataset_rows
    from sweeper.report import format_dropped_rows
    from sweeper.sweep import check_data

    check_data(space, profile)
    return format_dropped_rows(
        list(profile.unused),
        dataset_rows(profile.samples),
        space.dataset.path,
        doctor=space.doctor_command(),
    )
