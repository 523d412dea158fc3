"""What the recipe measures of a trial besides the step traces (child side, imports no torch): :class:`Measurements`,
whose fields are named as :class:`~sweeper.trial._result.TrialResult`'s stored attributes and copied onto it by
name in one place
(:func:`copy_onto`), which also copies an :class:`~sweeper.trial._child.outcome.Outcome`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sweeper.trial._child.record import TrainingRecord
from sweeper.trial._result import TrialResult


@dataclass
class Measurements:
    """A trial's measurements as they become known; None: not reached (the result keeps its own value).

    Attributes:
        warm: Whether the process had run a trial before this one.
        model_reused: Whether the kept 4-bit base model was reused.
        import_time_s: Seconds the heavy imports took in this trial (about 0 after the first).
        device: ``cpu`` or ``cuda:0 (<name>)``.
        quantized_linear_count: ``bitsandbytes.nn.Linear4bit`` modules after loading.
        load_time_s: Seconds to read the data, load (or reuse) the model and attach LoRA.
        load_peak_memory_gib: Peak memory while doing so (GiB).
        train_time_s: Seconds inside ``Trainer.train`` (for a NaN: until the diagnosis began).
        supervised_tokens_trace: Supervised tokens per step, the failing step included.
        min_supervised_tokens: Its minimum.
        longest_sample_tokens, longest_sample_index, truncated_sample_fraction: Over the samples trained on
            (:meth:`add_seen_lengths`).
        train_start: ``time.monotonic()`` when training began: not a result field (it makes ``setup_time_s``).
    """

    warm: bool | None = None
    model_reused: bool | None = None
    import_time_s: float | None = None
    device: str | None = None
    quantized_linear_count: int | None = None
    load_time_s: float | None = None
    load_peak_memory_gib: float | None = None
    train_time_s: float | None = None
    supervised_tokens_trace: list[int] | None = None
    min_supervised_tokens: int | None = None
    longest_sample_tokens: int | None = None
    longest_sample_index: int | None = None
    truncated_sample_fraction: float | None = None
    train_start: float | None = field(default=None, metadata={"result": False})

    def add_seen_lengths(self, record: TrainingRecord, n_tokens: Mapping[int, int], max_seq_length: int) -> None:
        """Set ``longest_sample_tokens``, ``longest_sample_index`` and ``truncated_sample_fraction`` over the samples
        the trial trained on (``n_tokens``: tokens before truncation by dataset index; unchanged when none was seen),
        and the supervised-token counts per step."""
        supervised = list(record.supervised)
        if record.step_supervised is not None and len(record.step_batches) > 0:
            supervised.append(record.step_supervised)  # the failing step, when it failed
        self.supervised_tokens_trace = supervised
        self.min_supervised_tokens = min(supervised) if supervised else None
        seen = [(n_tokens[i], i) for i in record.seen if i in n_tokens]
        if seen:
            longest, index = max(seen)
            self.longest_sample_tokens, self.longest_sample_index = longest, index
            self.truncated_sample_fraction = sum(1 for n, _ in seen if n > max_seq_length) / len(seen)


_RESULT_FIELDS = frozenset(TrialResult.stored_names())


def copy_onto(result: TrialResult, source: Any) -> None:
    """Copy every field of the dataclass ``source`` that is not None onto the :class:`TrialResult` field stored
    under the same name (:meth:`TrialResult.update`; fields without one, such as ``Measurements.train_start``, are
    skipped).

    Raises:
        TypeError: A field is marked as a result field but the result has none of that name (a renamed field).
    """
    for f in fields(source):
        if not f.metadata.get("result", True):
            continue
        if f.name not in _RESULT_FIELDS:
            raise TypeError(f"{type(source).__name__}.{f.name} is no TrialResult field")
        value = getattr(source, f.name)
        if value is not None:
            result.update({f.name: value})
