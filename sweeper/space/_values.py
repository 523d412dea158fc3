"""One value of ``space.yaml`` checked against its key: the per-trial keys and the sections' keys (from the
schema's dataclasses), each value's check and its description in a message, durations, study names, the nearest
valid key for a typo.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sweeper.space._schema import (
    DatasetSpec,
    KeySpec,
    ModelSpec,
    StudySpec,
    TrialConfig,
    key_specs,
)

#: Per-trial keys, by their ``space.yaml`` name: each may be set in ``training`` (fixed) or, when searchable, in
#: ``search``. Derived from :class:`TrialConfig`'s fields, which hold each key's default and check.
TRIAL_KEYS: Mapping[str, KeySpec] = MappingProxyType(key_specs(TrialConfig))


#: The keys of the ``study``, ``model`` and ``dataset`` sections, derived from their dataclasses.
_SECTIONS: Mapping[str, type] = MappingProxyType({"study": StudySpec, "model": ModelSpec, "dataset": DatasetSpec})


_SECTION_KEYS: Mapping[str, Mapping[str, KeySpec]] = MappingProxyType(
    {name: MappingProxyType(key_specs(cls)) for name, cls in _SECTIONS.items()}
)


#: Study names become file names (studies/<name>.db, studies/<name>/): no path separators, spaces or control characters.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


#: Names people type for a key that sweeper spells differently, with the fix.
_ALIASES = {
    "lr": "did you mean 'learning_rate'?",
    "lora_alpha": "lora_alpha is derived: set lora_alpha_ratio (lora_alpha = lora_alpha_ratio * r)",
    "lora_r": "did you mean 'r'?",
    "rank": "did you mean 'r'?",
    "batch_size": "did you mean 'per_device_train_batch_size'?",
    "micro_batch_size": "did you mean 'per_device_train_batch_size'?",
    "seq_len": "did you mean 'max_seq_length'?",
    "max_length": "did you mean 'max_seq_length'?",
    "cutoff_len": "did you mean 'max_seq_length'?",
    "sequence_len": "did you mean 'max_seq_length'?",
}


def yaml_value(value: Any) -> str:
    """A value as a space file writes it: ``true``, ``[q_proj, v_proj]``, ``0.5`` (for messages that name the value
    to write)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def parse_duration_s(value: Any) -> float:
    """Seconds from ``90``, ``"90s"``, ``"20m"``, ``"8h"``, ``"1h30m"`` or ``"2d"``.

    Raises:
        ValueError: Not a positive number of seconds nor such a string.
    """
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        if value <= 0 or not math.isfinite(value) or value > 366 * 86400:
            raise ValueError(value)
        return float(value)
    text = str(value).strip().lower()
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text)
    if not text or parts is None or not any(parts.groups()):
        raise ValueError(value)
    d, h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    total = d * 86400 + h * 3600 + m * 60 + s
    if total <= 0 or not math.isfinite(total) or total > 366 * 86400:
        raise ValueError(value)
    return total


def name_problem(value: object) -> str | None:
    """What makes ``value`` no valid study name (:data:`_NAME`: a letter or digit, then up to 99 letters, digits,
    ``.``, ``_`` or ``-``; it becomes a file name), in a few words, or None when it is one."""
    if not isinstance(value, str) or not value:
        return "it is empty"
    if len(value) > 100:
        return f"it is {len(value)} characters long, over 100"
    bad = sorted({c for c in value if not (c.isascii() and (c.isalnum() or c in "._-"))})
    if bad:
        return f"{', '.join(repr(c) for c in bad)} cannot be in a name"
    if not value[0].isalnum():
        return f"it starts with {value[0]!r}; start it with a letter or digit"
    if value.lower().endswith(".db"):
        return (
            f"it ends in .db, so 'sweep report {value}' would look for a file of that name; drop the .db (the study's "
            "file is studies/NAME.db)"
        )
    return None


def _describe(spec: KeySpec) -> str:
    if spec.kind == "name":
        return "a name of letters, digits, '.', '_' or '-' (it becomes a file name)"
    if spec.kind == "int" or spec.kind == "float":

        def num(x: float) -> str:  # integers in full (1048576, not 1.04858e+06)
            return str(int(x)) if float(x).is_integer() and abs(x) < 1e12 else f"{x:g}"

        lo = "" if spec.low is None else f"{'>' if spec.low_open else '>='} {num(spec.low)}"
        hi = "" if spec.high is None else f"{'<' if spec.high_open else '<='} {num(spec.high)}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        return f"{'an integer' if spec.kind == 'int' else 'a number'}{' ' + bounds if bounds else ''}"
    if spec.kind == "bool":
        return "true or false"
    if spec.kind == "choice":
        return "one of " + ", ".join(spec.choices)
    if spec.kind == "str_list":
        return f"a list, e.g. {spec.example}" if spec.example else "a list of module names, e.g. [q_proj, v_proj]"
    if spec.kind == "duration":
        return "a duration such as 90s, 20m or 8h (at most a year)"
    return "a string"


def _check_value(spec: KeySpec, value: Any) -> Any:
    """The value, normalised, or raise ValueError with what was expected."""
    if value is None and spec.optional:
        return None
    kind = spec.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ValueError
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            raise ValueError
        value = int(value)
    elif kind == "float":
        if isinstance(value, str):
            try:  # YAML reads 2e-4 (no dot) as a string
                value = float(value)
            except ValueError:
                raise ValueError from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError
        value = float(value)
    elif kind == "choice":
        if value not in spec.choices:
            raise ValueError
        return value
    elif kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise ValueError
        return value
    elif kind == "name":
        if not isinstance(value, str) or not _NAME.fullmatch(value) or name_problem(value):
            raise ValueError
        return value
    elif kind == "str_list":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise ValueError
        return tuple(value)
    elif kind == "duration":
        return parse_duration_s(value)
    if spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low):
        raise ValueError
    if spec.high is not None and (value >= spec.high if spec.high_open else value > spec.high):
        raise ValueError
    return value


def _suggest(key: str, valid: list[str]) -> str:
    if key in _ALIASES and (key != "lora_alpha" or "lora_alpha_ratio" in valid):
        return _ALIASES[key]
    # two letters swapped ("lgo") is the likeliest typo: difflib ranks "low" above "log" there
    close = [v for v in valid if sorted(v) == sorted(key)] or difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{close[0]}'?"
    return "valid keys are " + ", ".join(valid)


class _Problems:
    """Collects one line per problem; a key that came from ``--set`` is blamed on ``--set``, not on the file."""

    def __init__(self, file: str, overridden: frozenset[str] = frozenset()):
        self.file = file
        self.overridden = overridden
        self.lines: list[str] = []

    def add(self, key: str, what: str, fix: str) -> None:
        origin = "--set" if key in self.overridden else self.file
        if origin == "--set":  # named as --set takes it: a per-trial key bare (r), a section's key dotted
            key = key.removeprefix("training.")
        self.lines.append(f"{origin}: {key}: {what}; {fix}")
