"""The device a sweep's trials run on, read from the machine: its name and size, and the cap ``memory_limit_gib: auto``
stands for.

On CUDA the size is ``torch.cuda.get_device_properties(i).total_memory``, the figure ``set_per_process_memory_fraction``
(the trial's cap) is a fraction of; it is read in a short child process, so that the sweep's own process never holds
a CUDA context (about 0.5 GiB of the card, for the whole night). On the CPU it is the machine's ``MemTotal``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

from sweeper.memory import GIB
from sweeper.trial._devices import cuda_visible

#: What ``auto`` keeps free on a card, in GiB: the trial process's own CUDA context (torch's kernels, cuBLAS and
#: bitsandbytes' module), which lives outside the caching allocator and so outside both the measured peak and the cap.
#: Torch 2.x with lazy module loading holds 0.3-0.6 GiB of context on current cards (e68ad80's ``CUDA_CONTEXT_GIB``
#: guessed 0.5); the reading process measures what is in use before the first trial (:attr:`Card.in_use_gib`), and
#: ``sweep run`` warns when that is more than this reserve. ``benchmarks/gpu_check.sh`` measures a trial process's
#: context on the GPU it runs on.
CUDA_RESERVE_GIB = 0.5
#: What ``auto`` keeps free on the CPU, in GiB: the sweep's own process and its zygote (0.5 GiB resident each,
#: measured on this project's CPU machine with ``ps`` during a sweep of the built-in model).
CPU_RESERVE_GIB = 1.0

_READ_CUDA = """
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    out.append({"name": p.name, "total_memory": p.total_memory, "in_use": total - free})
print(json.dumps(out))
"""


@dataclass(frozen=True, kw_only=True)
class Card:
    """One device's size, as read on this machine.

    Attributes:
        device: ``cuda`` or ``cpu``.
        name: The GPU's name (``NVIDIA GeForce RTX 4090``), or ``this machine`` on the CPU.
        total_memory_gib: CUDA: ``total_memory`` in GiB; CPU: ``MemTotal``.
        in_use_gib: What was in use on it when it was read, in GiB (CUDA: ``total - free`` of ``mem_get_info``,
            after the reading process's own context was created, so it counts that context and every other
            process's memory; CPU: ``MemTotal - MemAvailable``); None when not read.
        given: Not read but given (``sweep estimate --card-gib``): a card elsewhere, not this machine.
    """

    device: str
    name: str
    total_memory_gib: float
    in_use_gib: float | None = None
    given: bool = False

    @property
    def reserve_gib(self) -> float:
        """What ``auto`` keeps free: :data:`CUDA_RESERVE_GIB` or :data:`CPU_RESERVE_GIB`."""
        return CUDA_RESERVE_GIB if self.device == "cuda" else CPU_RESERVE_GIB

    @property
    def auto_memory_limit_gib(self) -> float:
        """The cap ``memory_limit_gib: auto`` stands for: the size less :attr:`reserve_gib`, rounded down to
        0.01 GiB (the same figure on every run on the same card, so a resumed study keeps its setup).

        Raises:
            ValueError: The card is not larger than the reserve.
        """
        cap = math.floor((self.total_memory_gib - self.reserve_gib) * 100) / 100
        if cap <= 0:
            raise ValueError(
                f"{self.name} has {self.total_memory_gib:.2f} GiB, no more than the {self.reserve_gib:g} GiB auto "
                "keeps free"
            )
        return cap


class CardError(RuntimeError):
    """The device could not be read (no CUDA device visible, or the reading process failed)."""


def read_cards(device: str, cuda_visible_devices: str | None = None, timeout_s: float = 120.0) -> list[Card]:
    """The devices a sweep's trials would run on: every visible CUDA device (``cuda_visible_devices`` narrows them as
    ``CUDA_VISIBLE_DEVICES`` does), read in a child process; or, for ``cpu``, this machine.

    Raises:
        CardError: No CUDA device is visible, or the reading process failed or timed out (its last line says why).
    """
    if device == "cpu":
        return [_cpu_card()]
    env = dict(os.environ)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if not cuda_visible(env):  # no driver: say so without starting a process that imports torch
        raise CardError("no CUDA device is visible here (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them all)")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _READ_CUDA], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise CardError(f"reading the CUDA device took over {timeout_s:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CardError(f"reading the CUDA device failed: {last}")
    cards = [
        Card(device="cuda", name=c["name"], total_memory_gib=c["total_memory"] / GIB, in_use_gib=c["in_use"] / GIB)
        for c in json.loads(done.stdout.strip().splitlines()[-1])
    ]
    if not cards:
        raise CardError("no CUDA device is visible (torch.cuda.device_count() is 0)")
    return cards


def smallest_card(cards: list[Card]) -> Card:
    """The card a cap must fit when trials run on several: the smallest (the first of equal ones)."""
    return min(cards, key=lambda c: c.total_memory_gib)


def _cpu_card() -> Card:
    """This machine from ``/proc/meminfo`` (``os.sysconf`` where there is none)."""
    fields: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    available = fields.get("MemAvailable")
    return Card(
        device="cpu",
        name="this machine",
        total_memory_gib=total,
        in_use_gib=None if available is None else total - available,
    )
