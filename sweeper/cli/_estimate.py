"""``sweep estimate SPACE.yaml``: predicted peak memory of the space's configurations, no weights loaded."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.cli._common import _load, _print
from sweeper.errors import SpaceError, SweeperError
from sweeper.report import format_cap, format_params, format_same_rows

if TYPE_CHECKING:
    from sweeper.devices import Card
    from sweeper.memory import ModelShape
    from sweeper.space import SearchSpace


def cmd_estimate(args: argparse.Namespace) -> int:
    """``sweep estimate SPACE.yaml``: predicted peak GPU memory of each memory-relevant point of the space, the terms
    of the largest, and the fit frontier against memory_limit_gib; no weights are loaded."""
    from sweeper.memory import estimate_space, frontier
    from sweeper.sweep import with_card

    if args.card_gib is not None and not (0 < args.card_gib < 65536):
        raise SpaceError(f"--card-gib: {args.card_gib:g} is not a card's size; give GiB, e.g. --card-gib 23.6")
    space, card, card_warnings = with_card(_load(args), args.device, card_gib=args.card_gib)
    shape = _model_shape(space)
    longest, tokens, data_line = _longest_sample(space)
    try:
        estimated = estimate_space(space, shape, args.device, longest_sample_tokens=longest, data_tokens=tokens)
    except ValueError as exc:
        raise SpaceError(f"{space.path}: training.target_modules: {exc}") from None
    edge = frontier(estimated.points, space.base.memory_limit_gib)
    if args.json:
        record = {
            "model": space.model.name_or_path,
            "device": args.device,
            "memory_limit_gib": space.base.memory_limit_gib,
            "card": None if card is None else {"name": card.name, "total_memory_gib": round(card.total_memory_gib, 3)},
            "longest_sample_tokens": longest,
            "data_tokens": tokens,
            "points": estimated.points,
            "frontier": edge,
        }
        _print(json.dumps(record, indent=1))
    else:
        _print_estimate(space, args.device, shape, estimated, edge, card, card_warnings, (data_line, longest))
    return 0


def _print_estimate(
    space: SearchSpace,
    device: str,
    shape: ModelShape,
    estimated: Any,
    edge: list[dict[str, Any]],
    card: Card | None,
    card_warnings: list[str],
    data: tuple[str, int | None],
) -> None:
    """``sweep estimate``'s text: the header with the cap, the card's warnings, the data's line and the same-rows
    settlement at its longest sample (``data``: the line and the tokens), every configuration's prediction, the
    frontier and the memory model's caveat."""
    data_line, longest = data
    points, size, keys = estimated.points, estimated.grid_size, estimated.searched
    limit = space.base.memory_limit_gib
    fits = sum(1 for p in points if p["predicted_peak_gib"] <= limit)
    cap = format_cap(
        limit,
        space.memory_limit_auto,
        card.name if card else None,
        card.total_memory_gib if card else None,
        device,
        given=card is not None and card.given,
    )
    _print(
        f"sweep estimate: {space.model.name_or_path} ({shape.num_hidden_layers} layers, hidden {shape.hidden_size}, "
        f"vocabulary {shape.vocab_size}), {len(points)} memory-relevant configurations of {space.path}; "
        f"{fits} predicted to fit memory_limit_gib={limit:g} ({cap})"
    )
    for line in card_warnings:
        _print(line)
    if size > len(points):
        _print(
            f"WARNING the space has {size} memory-relevant configurations; only the first {len(points)} were "
            "estimated, so the frontier may miss some: fix keys with --set or narrow the lists"
        )
    _print(data_line)
    same = format_same_rows(space.values_of("max_seq_length"), longest, space.values_of("packing"))
    if same:
        _print(f"data    {same}")
    _print_points(points, limit, device)
    _print_frontier(edge, keys, limit)
    _print(_model_caveat(device))


def _model_caveat(device: str) -> str:
    """The estimate's last line: what the prediction is checked against on ``device``, each device's own
    uncertainty (on the CPU there is no CUDA context or caching allocator)."""
    if device == "cuda":
        return (
            "a model, not a measurement: on an H200 it was within 3.5% of 7 measured 8B peaks it was not fitted on "
            "(docs/memory.md); other models, GPUs and versions are not checked, and 'sweep run' corrects it with the "
            "peaks its trials measure"
        )
    return (
        "a model, not a measurement: the CPU process's own memory is a fixed figure (CPU_PROCESS_BASELINE_GIB, "
        "sweeper/memory), and 'sweep run' corrects the model with the peaks its trials measure"
    )


def _longest_sample(space: SearchSpace) -> tuple[int | None, int | None, str]:
    """The space's data tokenized as the trials tokenize it: its longest sample's tokens, the file's tokens in all
    (the most a packed row holds), and the line that says what the predictions are of. When the data or the
    tokenizer cannot be read, None, None and a line saying the predictions are at ``max_seq_length`` (each row as
    long as it: an upper bound).

    Raises:
        SpaceError: Data the trials refuse (:func:`sweeper.sweep.check_data`: fewer rows, or packed rows, than a
            searched batch), as ``sweep trial`` and ``sweep run`` refuse it: no prediction of a step never run.
    """
    from sweeper.cli._common import _prepare, _profile
    from sweeper.sweep import check_data

    try:
        model_path, samples = _prepare(space.dataset, space.model)
        profile = _profile(space, model_path, samples, audit=False)
        file = profile.file
    except SweeperError as exc:
        why = "; ".join(exc.problems)[:200]
        return (
            None,
            None,
            (
                f"data    not read ({why}): each configuration is predicted at max_seq_length, rows as long as it "
                "(an upper bound: a trial pads each micro-batch to its longest row)"
            ),
        )
    check_data(space, profile)  # what the trials would refuse is refused here too (issue 68), outside the try above
    longest = file.longest
    if not longest:
        return None, None, f"data    {space.dataset.path}: no sample to train on; predicted at max_seq_length"
    sampled = (
        f" (the trials sample {file.sampled} of them, dataset.max_samples, whose longest is {file.sampled_longest:,}; "
        "the exports train the whole file)"
        if file.cut
        else ""
    )
    return (
        longest,
        file.tokens,
        (
            f"data    {space.dataset.path}: {len(file.lengths)} samples{sampled}, the longest {longest:,} tokens, "
            f"{file.tokens:,} in all: each configuration is predicted at its worst step on this data, "
            f"per_device_train_batch_size rows of min(max_seq_length, {longest:,}) tokens (packed: of "
            f"min(max_seq_length, {file.tokens:,}))"
        ),
    )


def _model_shape(space: SearchSpace) -> ModelShape:
    """The shape of the space's model: a known one by name, else read from its folder's config.json (a
    :class:`SweeperError` naming that file when it cannot be read)."""
    from sweeper.memory import ModelShape, known_shape
    from sweeper.model import resolve_model

    name = space.model.name_or_path
    known = known_shape(name)
    model_path = name if known else resolve_model(space.model)
    try:
        return ModelShape.from_config(known) if known else ModelShape.from_dir(model_path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SweeperError(
            [
                f"{Path(model_path) / 'config.json'}: model.name_or_path: cannot read the model's shape ({exc}); give "
                "a folder whose config.json has hidden_size, intermediate_size, num_hidden_layers, "
                "num_attention_heads and vocab_size"
            ]
        ) from None


def _print_points(points: list[dict[str, Any]], limit: float, device: str) -> None:
    """The predicted peaks, lowest first (the first and last ten when there are more than 20), and the terms of the
    largest."""
    _print(
        "predicted peak GPU memory (max_memory_reserved), GiB, lowest first:"
        if device == "cuda"
        else "predicted peak resident set of a CPU trial, GiB, lowest first (it runs 0.3-0.5 GiB under the measured "
        "peak for the built-in model):"
    )
    for p in points[:10] + ([] if len(points) <= 20 else [None]) + points[max(10, len(points) - 10) :]:
        if p is None:
            _print("  ...")
            continue
        mark = "fits" if p["predicted_peak_gib"] <= limit else "OOM "
        _print(f"  {p['predicted_peak_gib']:7.2f}  {mark}  {format_params(p['params'])}")
    largest = points[-1]
    _print("terms of the largest (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in largest["terms_gib"].items()))


def _print_frontier(edge: list[dict[str, Any]], keys: Sequence[str], limit: float) -> None:
    """Per batch size, the largest max_seq_length predicted to fit ``limit`` (:func:`sweeper.memory.frontier`)."""
    _print(
        f"frontier for memory_limit_gib={limit:g} (largest max_seq_length predicted to fit, at the cheapest "
        "setting of the other keys; in brackets whatever the other keys):"
    )
    others = [k for k in keys if k not in ("per_device_train_batch_size", "max_seq_length")]
    for e in edge:
        if e["max_seq_length"] is None:
            _print(f"  batch {e['per_device_train_batch_size']}: nothing fits")
            continue
        at = format_params({k: e["params"][k] for k in others})
        every = e["max_seq_length_all_settings"]
        _print(
            f"  batch {e['per_device_train_batch_size']}: max_seq_length {e['max_seq_length']} "
            f"({e['predicted_peak_gib']:.1f} GiB{', at ' + at if at else ''}) "
            f"[{every if every is not None else 'none'}]"
        )
