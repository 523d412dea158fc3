"""A validated space file (:class:`SearchSpace`): its sections, the base trial config, the searched dimensions, and
the configs and commands made from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweeper.space._schema import (
    Categorical,
    DatasetSpec,
    Dimension,
    ModelSpec,
    StudySpec,
    TrialConfig,
    field_name,
)
from sweeper.space._values import TRIAL_KEYS


def _from_yaml(cls: type, values: Mapping[str, Any], **extra: Any) -> Any:
    """An instance of settings dataclass ``cls`` from values keyed by their ``space.yaml`` names."""
    return cls(**{field_name(cls, k): v for k, v in values.items()}, **extra)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """A validated space file.

    Attributes:
        path: The file it came from (for messages).
        study: The ``study`` section.
        model: The ``model`` section.
        dataset: The ``dataset`` section.
        base: Every per-trial setting, typed: the file's ``training`` section and scalars of ``search`` over the
            schema's defaults, each searched key at its first choice (a list's first element, a range's ``low``).
            A trial's config is this one with the sampled values (:meth:`trial_config`).
        search: The searched keys, in file order: ``Categorical`` or ``Range``.
        overridden: The keys ``--set`` gave (``dataset.path``, ``training.max_steps``, ...).
        set_items: The ``--set KEY=VALUE`` items as given, in order (for the commands hints print: :meth:`command`).
        memory_limit_auto: ``memory_limit_gib: auto``: the cap is the device's own size less a reserve
            (:class:`sweeper.devices.Card`); until :meth:`with_memory_limit` sets it from the device,
            ``base.memory_limit_gib`` holds the schema's default, which no command uses as the cap.
    """

    path: str
    study: StudySpec
    model: ModelSpec
    dataset: DatasetSpec
    base: TrialConfig
    search: Mapping[str, Dimension]
    overridden: frozenset[str] = frozenset()
    set_items: tuple[str, ...] = ()
    memory_limit_auto: bool = False

    def with_memory_limit(self, limit_gib: float) -> SearchSpace:
        """This space with ``memory_limit_gib`` set (what ``auto`` stands for on the device that was read);
        :attr:`memory_limit_auto` stays as the file said."""
        return dataclasses.replace(self, base=dataclasses.replace(self.base, memory_limit_gib=float(limit_gib)))

    def command(self, verb: str) -> str:
        """``sweep <verb> <path>`` with every ``--set`` this space was loaded with, quoted for a POSIX shell, so that
        a hint runs on the settings that ran (a dropped ``--set memory_limit_gib=...`` would answer for another
        cap)."""
        import shlex

        return " ".join(["sweep", verb, shlex.quote(self.path), *(f"--set {shlex.quote(s)}" for s in self.set_items)])

    def doctor_command(self) -> str:
        """The ``sweep doctor`` command that audits the data the trials read: the space file, or, when ``--set``
        changed the dataset or the model (so the file's own would be audited instead), the data file itself with the
        model and the space's ``max_seq_length`` values."""
        if not any(k.startswith(("dataset.", "model.")) for k in self.overridden):
            return f"sweep doctor {self.path}"
        lengths = " ".join(str(v) for v in sorted(set(self.values_of("max_seq_length"))))
        return f"sweep doctor {self.dataset.path} --model {self.model.name_or_path} --max-seq-length {lengths}"

    def trial_config(self, params: Mapping[str, Any]) -> TrialConfig:
        """The config of one trial: the fixed values, overridden by ``params`` (one value per searched key).

        Raises:
            KeyError: ``params`` misses a searched key or names a key that is not per-trial.
        """
        missing = [k for k in self.search if k not in params]
        if missing:
            raise KeyError(f"params miss searched keys {missing}")
        unknown = [k for k in params if k not in TRIAL_KEYS]
        if unknown:
            raise KeyError(f"not per-trial keys: {unknown}")
        return dataclasses.replace(self.base, **{field_name(TrialConfig, k): v for k, v in params.items()})

    def fixed_value(self, key: str) -> Any:
        """The value of a per-trial key by its ``space.yaml`` name (``trial_timeout`` in seconds), as every trial
        has it when it is not searched.

        Raises:
            KeyError: ``key`` is not a per-trial key.
        """
        return getattr(self.base, field_name(TrialConfig, key))

    def values_of(self, key: str) -> list[Any]:
        """The values a per-trial key takes in the sweep: a list's distinct choices (sorted), a range's ends, or the
        fixed value.

        Raises:
            KeyError: ``key`` is not a per-trial key.
        """
        dim = self.search.get(key)
        if dim is None:
            return [self.fixed_value(key)]
        if isinstance(dim, Categorical):
            return sorted(set(dim.choices))
        return sorted({int(dim.low), int(dim.high)} if dim.is_int else {dim.low, dim.high})

    def first_choices(self) -> dict[str, Any]:
        """One value per searched key: a list's first element, a range's ``low``."""
        return _first_choices(self.search)


def _first_choices(search: Mapping[str, Dimension]) -> dict[str, Any]:
    """One value per searched key: a list's first element, a range's ``low``."""
    return {
        key: dim.choices[0] if isinstance(dim, Categorical) else (int(dim.low) if dim.is_int else dim.low)
        for key, dim in search.items()
    }
