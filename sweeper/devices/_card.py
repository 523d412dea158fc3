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

from sweeper.devices._cuda import cuda_visible
from sweeper.memory import GIB

#: What ``auto`` keeps free on a card, in GiB, where the context cannot be read (:attr:`Card.context_gib`): the trial
#: process's own CUDA context (torch's kernels, cuBLAS and bitsandbytes' module), which lives outside the caching
#: allocator and so outside both the measured peak and the cap. Torch 2.x with lazy module loading holds 0.3-0.6 GiB
#: of context on current cards (e68ad80's ``CUDA_CONTEXT_GIB`` guessed 0.5; training receipts of other projects read
#: 0.13 GiB on an RTX A2000 and 0.62 GiB on an RTX 5090); ``sweep run`` warns when more than this was in use when
#: the card was read. ``benchmarks/gpu/gpu_check.sh`` records the context as read on the GPU it runs on.
CUDA_RESERVE_GIB = 0.5
#: What ``auto`` keeps free on the CPU, in GiB: the sweep's own process and its zygote (0.5 GiB resident each,
#: measured on this project's CPU machine with ``ps`` during a sweep of the built-in model).
CPU_RESERVE_GIB = 1.0

#: The reading process: each card's size and what is in use on it, and its own context (what the driver counts in
#: use once the process holds a context with cuBLAS loaded, less what it counted before, less the caching
#: allocator's own reserve); the driver's counts from ``nvidia-smi``, by the card's UUID (``CUDA_VISIBLE_DEVICES``
#: renumbers cards, not UUIDs), none where ``nvidia-smi`` cannot be run.
_READ_CUDA = """
import json, subprocess, torch

def driver_used():
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    used = {}
    for line in done.stdout.splitlines():
        uuid, _, mib = line.partition(",")
        try:
            used[uuid.strip().lower().removeprefix("gpu-")] = int(mib) * 2**20
        except ValueError:
            pass
    return used

before = driver_used()  # before this process holds a context on any card
out = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    card = {"name": p.name, "total_memory": p.total_memory, "in_use": total - free, "context": None}
    uuid = str(getattr(p, "uuid", "")).lower().removeprefix("gpu-")
    if uuid in before:
        a = torch.ones(256, 256, device=i)
        float((a @ a).sum())  # cuBLAS loaded, as in every trial
        torch.cuda.synchronize(i)
        free, total = torch.cuda.mem_get_info(i)
        card["context"] = total - free - before[uuid] - torch.cuda.memory_reserved(i)
    out.append(card)
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
        context_gib: CUDA: the reading process's own context on it with cuBLAS loaded, in GiB (what the driver
            counted in use after, less before, less the caching allocator's reserve; ``nvidia-smi``'s counts), which a
            trial process holds at least; None where it cannot be read (no ``nvidia-smi``), and on the CPU.
    """

    device: str
    name: str
    total_memory_gib: float
    in_use_gib: float | None = None
    given: bool = False
    context_gib: float | None = None

    @property
    def reserve_gib(self) -> float:
        """What ``auto`` keeps free: on CUDA :data:`CUDA_RESERVE_GIB`, or the context as read (:attr:`context_gib`)
        rounded up to 0.05 GiB where that is more (a trial process holds at least what the reading process held);
        on the CPU :data:`CPU_RESERVE_GIB`."""
        if self.device != "cuda":
            return CPU_RESERVE_GIB
        read = math.ceil(self.context_gib * 20) / 20 if self.context_gib is not None else 0.0
        return max(CUDA_RESERVE_GIB, read)

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
        Card(
            device="cuda",
            name=c["name"],
            total_memory_gib=c["total_memory"] / GIB,
            in_use_gib=c["in_use"] / GIB,
            context_gib=None if c.get("context") is None else max(0.0, c["context"] / GIB),
        )
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
