"""The card policy: the device the trials run on, read once, the ``auto`` cap set from it, a cap above a card
refused and one above the machine or a card in use warned of; for every command that plans trials."""

from __future__ import annotations

from sweeper.devices import Card
from sweeper.errors import SpaceError
from sweeper.space import SearchSpace


def with_card(
    space: SearchSpace, device: str, devices: list[str] | None = None, card_gib: float | None = None
) -> tuple[SearchSpace, Card | None, list[str]]:
    """The device the trials run on, read once (:func:`sweeper.devices.read_cards`; on CUDA the smallest of
    ``devices``), the space with ``memory_limit_gib: auto`` set from it, and the warnings it calls for.

    The card policy of ``sweep run``, ``sweep trial`` and ``sweep estimate``. ``card_gib`` (``sweep estimate
    --card-gib``) stands for a card that is not on this machine (:attr:`sweeper.devices.Card.given`). A CUDA device that
    cannot be read leaves a numeric cap unchecked (``sweep estimate`` plans for cards elsewhere) and refuses ``auto``.

    Raises:
        SpaceError: ``auto`` and no card to read; a cap above the card's size (CUDA: one line naming the file, the
            key and the fix).
    """
    from sweeper.devices import Card, CardError, read_cards, smallest_card

    card: Card | None = None
    allocator = _allocator_warnings(space, device)
    if card_gib is not None:
        card = Card(device=device, name="given by --card-gib", total_memory_gib=card_gib, given=True)
    else:
        try:
            card = smallest_card(read_cards(device, ",".join(devices) if devices else None))
        except CardError as exc:
            if space.memory_limit_auto:
                raise SpaceError(
                    f"{space.path}: training.memory_limit_gib: auto is the card's own size, and {exc}; run where the "
                    "card is, give its size (sweep estimate --card-gib 23.6 for a card torch reports at 23.6 GiB), "
                    "or set a number (--set memory_limit_gib=22)"
                ) from None
    if card is None:
        return space, None, allocator
    warnings = allocator
    if space.memory_limit_auto:
        try:
            space = space.with_memory_limit(card.auto_memory_limit_gib)
        except ValueError as exc:
            raise SpaceError(f"{space.path}: training.memory_limit_gib: auto: {exc}; set a number") from None
    cap = space.base.memory_limit_gib
    if cap > card.total_memory_gib and device == "cuda":
        raise SpaceError(
            f"{space.path}: training.memory_limit_gib: {cap:g} GiB is more than the card's "
            f"{card.total_memory_gib:.2f} GiB ({card.name}); set it to auto "
            f"({card.total_memory_gib - card.reserve_gib:.2f} GiB there) or lower"
        )
    if cap > card.total_memory_gib:
        machine = "the machine" if card.given else "this machine"
        warnings.append(
            f"WARNING memory: the cap ({cap:g} GiB) is more than {machine}'s {card.total_memory_gib:.2f} GiB: it "
            "cannot bind, and a trial that needs more is killed by the system (a crash, not an oom); set "
            "memory_limit_gib lower or to auto"
        )
    # what was in use counts the reading process's own context (about the reserve): warn past it by 0.25 GiB
    if device == "cuda" and card.in_use_gib is not None and card.in_use_gib > card.reserve_gib + 0.25:
        warnings.append(
            f"WARNING memory: {card.in_use_gib:.2f} GiB of the card ({card.name}) was in use when it was read (the "
            f"reading process's CUDA context and every other process on it), more than the {card.reserve_gib:g} GiB "
            "auto keeps free: a trial may run out of memory below the cap; free the card or lower memory_limit_gib"
        )
    return space, card, warnings


def _allocator_warnings(space: SearchSpace, device: str) -> list[str]:
    """What the trials' ``expandable_segments`` (:attr:`sweeper.space.TrialConfig.expandable_segments`) overrides or
    cannot do: on CUDA, an ``expandable_segments`` option in the environment (each trial runs under the space's
    value instead); on the CPU, the key searched (the CUDA allocator moves nothing there: its values measure the
    same, and the sweep reuses one as the other's repeat), and the allocator options the environment gives under
    either of torch's names (none reaches a CPU trial, and the exports carry only the trial's
    ``expandable_segments``: issue 68)."""
    from sweeper.devices import environment_alloc_conf, environment_expandable_segments

    values = space.values_of("expandable_segments")
    if device == "cuda" and (given := environment_expandable_segments()) is not None:
        said = " or ".join(str(v).lower() for v in values)
        return [
            f"WARNING memory: the environment gives the CUDA allocator expandable_segments:{given}, but each trial "
            f"runs under the space's expandable_segments ({said}); set it in {space.path} (training: "
            "expandable_segments: true) to measure with it"
        ]
    out = []
    if device != "cuda" and "expandable_segments" in space.search:
        out.append(
            f"WARNING memory: {space.path}: search: expandable_segments is a CUDA allocator setting; on the CPU it "
            "moves nothing, so its values measure the same (each trial records it as not applicable, and a "
            "configuration that differs only in it is a repeat of the one measured)"
        )
    if device != "cuda" and (given := environment_alloc_conf()):
        out.append(
            f"note    the environment gives the CUDA allocator {given} (PYTORCH_CUDA_ALLOC_CONF or "
            "PYTORCH_ALLOC_CONF): it moves nothing on the CPU, so no trial measures it, and the exports' environment "
            "carries only the trial's expandable_segments; on the card, set these options yourself"
        )
    return out
