"""``space.yaml`` to typed, frozen objects: the study, the model, the data, fixed settings and the search dimensions.

Pure: imports neither torch nor optuna, so it loads and validates in milliseconds. The file's shape (the contract in
``docs/contract.md``)::

    study:    {name, n_trials, timeout, sampler, seed, storage}
    model:    {name_or_path, attn_implementation, trust_remote_code}
    dataset:  {path, format, max_samples, seed, split}
    training: {<key>: value}            # fixed for every trial
    search:   {<key>: [a, b] | {low, high, log, step} | value}

A list is categorical, a mapping is a range, a scalar is fixed. ``lora_alpha = lora_alpha_ratio * r``. Every problem
in a file is collected and raised together as one :class:`~sweeper.errors.SpaceError`, one line each naming the file,
the key and the fix; unknown keys suggest the nearest valid key (``difflib.get_close_matches``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from sweeper.errors import SpaceError
from sweeper.space._overrides import apply_overrides
from sweeper.space._schema import (
    Categorical,
    DatasetSpec,
    Dimension,
    KeySpec,
    ModelSpec,
    Range,
    StudySpec,
    TrialConfig,
)
from sweeper.space._space import SearchSpace, _first_choices, _from_yaml
from sweeper.space._values import _SECTION_KEYS, TRIAL_KEYS, _check_value, _describe, _Problems, _suggest, name_problem

_TOP_KEYS = ("study", "model", "dataset", "training", "search")


_RANGE_KEYS = ("low", "high", "log", "step")


#: ``memory_limit_gib: auto``, and the key under which :func:`_parse_training` notes it.
AUTO = "auto"


AUTO_KEY = "memory_limit_gib:auto"


def _parse_list(where: str, raw: list[Any], spec: KeySpec, problems: _Problems) -> Categorical | None:
    """A YAML list under ``search``: a categorical dimension of valid, distinct values, or None (problems added)."""
    if not raw:
        problems.add(where, "empty list", "give at least one value, or remove the key")
        return None
    values, bad = [], False
    for v in raw:
        try:
            values.append(_check_value(spec, v))
        except ValueError:
            problems.add(where, f"{v!r} is not valid", f"each value must be {_describe(spec)}")
            bad = True
    if bad:
        return None
    if len(set(map(repr, values))) != len(values):
        problems.add(where, f"repeated values in {raw!r}", "list each value once")
        return None
    return Categorical(choices=tuple(values))


def _parse_range(where: str, raw: dict[Any, Any], spec: KeySpec, problems: _Problems) -> Range | None:
    """A YAML mapping under ``search``: a range ``{low, high, log, step}`` of a numeric key, or None (problems
    added)."""
    if spec.kind not in ("int", "float"):
        problems.add(where, "a range {low, high} needs a numeric key", f"give a list of values, each {_describe(spec)}")
        return None
    unknown = [k for k in raw if k not in _RANGE_KEYS]
    for k in unknown:
        problems.add(f"{where}.{k}", "unknown range key", _suggest(str(k), list(_RANGE_KEYS)))
    if unknown:
        return None
    if "low" not in raw or "high" not in raw:
        problems.add(
            where, "a range needs both low and high", f"write {{low: ..., high: ...}} with values {_describe(spec)}"
        )
        return None
    if any(isinstance(raw[k], bool) or not isinstance(raw[k], (int, float, str)) for k in ("low", "high")):
        problems.add(
            where, f"low={raw['low']!r}, high={raw['high']!r} are not numbers", f"both must be {_describe(spec)}"
        )
        return None
    try:
        low, high = _check_value(spec, raw["low"]), _check_value(spec, raw["high"])
    except ValueError:
        problems.add(
            where, f"low={raw['low']!r}, high={raw['high']!r} out of bounds", f"both must be {_describe(spec)}"
        )
        return None
    step: Any = raw.get("step")  # a number once _range_options_valid has passed it
    if isinstance(step, str):  # YAML 1.1 reads 1e-5 (no dot) as a string, as it does for low and high
        try:
            step = float(step)
        except ValueError:
            pass  # refused below, as given
    if not _range_options_valid(where, low, high, raw.get("log", False), step, spec, problems):
        return None
    return Range(
        low=low,
        high=high,
        log=raw.get("log", False),
        step=None if step is None else float(step),
        is_int=spec.kind == "int",
    )


def _range_options_valid(
    where: str, low: Any, high: Any, log: Any, step: Any, spec: KeySpec, problems: _Problems
) -> bool:
    """Whether a range's ``low <= high``, ``log`` and ``step`` are valid together (each problem added)."""
    ok = True
    if not isinstance(log, bool):
        problems.add(f"{where}.log", f"{log!r} is not true/false", "write log: true or log: false")
        ok = False
    if low > high:
        problems.add(where, f"low <= high must hold, but got low={low}, high={high}", "swap them")
        ok = False
    if log is True and low <= 0:
        problems.add(where, f"a log range needs low > 0, but got low={low}", "raise low or drop log")
        ok = False
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < math.inf:
            problems.add(f"{where}.step", f"{step!r} is not a positive number", "give a positive step or drop it")
            ok = False
        elif spec.kind == "int" and not float(step).is_integer():
            problems.add(f"{where}.step", f"{step!r} is not an integer", "an integer key needs an integer step")
            ok = False
        elif log is True:
            problems.add(where, "log and step cannot be combined (optuna)", "drop one of them")
            ok = False
        elif step > high - low and high > low:
            problems.add(
                f"{where}.step",
                f"step={step} is larger than high - low = {high - low}",
                "use a smaller step, or a list of values",
            )
            ok = False
    return ok


def _parse_dimension(key: str, raw: Any, spec: KeySpec, problems: _Problems) -> Dimension | Any | None:
    where = f"search.{key}"
    if isinstance(raw, list):
        return _parse_list(where, raw, spec, problems)
    if isinstance(raw, dict):
        return _parse_range(where, raw, spec, problems)
    try:
        return ("fixed", _check_value(spec, raw))
    except ValueError:
        problems.add(where, f"{raw!r} is not valid", f"give {_describe(spec)}, a list of such values, or a range")
        return None


def _parse_section(name: str, raw: Any, problems: _Problems) -> dict[str, Any]:
    keys = _SECTION_KEYS[name]
    out = {k: s.default for k, s in keys.items()}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.add(name, f"expected a mapping, got {type(raw).__name__}", f"write it as '{name}: {{key: value}}'")
        return out
    for key, value in raw.items():
        spec = keys.get(key)
        if spec is None:
            problems.add(f"{name}.{key}", "unknown key", _suggest(str(key), list(keys)))
            continue
        try:
            out[key] = _check_value(spec, value)
        except ValueError:
            why = f" ({name_problem(value)})" if spec.kind == "name" and name_problem(value) else ""
            problems.add(f"{name}.{key}", f"{value!r} is not valid{why}", f"give {_describe(spec)}")
    return out


def _parse_training(training: Any, problems: _Problems) -> dict[str, Any]:
    """The per-trial values of the ``training`` section over the schema's defaults, by ``space.yaml`` name; each
    problem is added to ``problems``."""
    fixed: dict[str, Any] = {k: s.default for k, s in TRIAL_KEYS.items()}
    if training is not None and not isinstance(training, dict):
        problems.add("training", f"expected a mapping, got {type(training).__name__}", "write 'training: {key: value}'")
        training = {}
    for key, value in (training or {}).items():
        spec = TRIAL_KEYS.get(key)
        if spec is None:
            problems.add(f"training.{key}", "unknown key", _suggest(str(key), list(TRIAL_KEYS)))
            continue
        if isinstance(value, (list, dict)) and spec.kind != "str_list":
            fix = (
                f"--set fixes one value; to search several, list them under search.{key} in the file"
                if f"training.{key}" in problems.overridden
                else f"move '{key}' to the search section to search it"
            )
            problems.add(f"training.{key}", "training values are fixed", fix)
            continue
        if key == "memory_limit_gib" and isinstance(value, str) and value.strip().lower() == AUTO:
            fixed[AUTO_KEY] = True  # the default stays until the device is read (SearchSpace.with_memory_limit)
            continue
        try:
            fixed[key] = _check_value(spec, value)
        except ValueError:
            fix = f"give {_describe(spec)}" + (", or auto (the card's own size)" if key == "memory_limit_gib" else "")
            problems.add(f"training.{key}", f"{value!r} is not valid", fix)

    return fixed


def _parse_search(search_raw: Any, training: Any, fixed: dict[str, Any], problems: _Problems) -> dict[str, Dimension]:
    """The searched dimensions of the ``search`` section, in file order; a scalar or a one-element list there is a
    fixed value (written into ``fixed``); each problem is added to ``problems``."""
    search: dict[str, Dimension] = {}
    if search_raw is not None and not isinstance(search_raw, dict):
        problems.add(
            "search", f"expected a mapping, got {type(search_raw).__name__}", "write 'search: {key: [values]}'"
        )
        search_raw = {}
    for key, value in (search_raw or {}).items():
        spec = TRIAL_KEYS.get(key)
        searchable = [k for k, s in TRIAL_KEYS.items() if s.searchable]
        if spec is None:
            problems.add(f"search.{key}", "unknown key", _suggest(str(key), searchable))
            continue
        if not spec.searchable:
            problems.add(f"search.{key}", "cannot be searched", f"move '{key}' to the training section")
            continue
        if isinstance(training, dict) and key in training:
            problems.add(f"search.{key}", "set in both training and search", "keep it in one of the two")
            continue
        dim = _parse_dimension(key, value, spec, problems)
        if isinstance(dim, tuple):
            fixed[key] = dim[1]
        elif isinstance(dim, Categorical) and len(dim.choices) == 1:
            fixed[key] = dim.choices[0]
        elif dim is not None:
            search[key] = dim
    return search


def _extent(key: str, fixed: Mapping[str, Any], search: Mapping[str, Dimension]) -> tuple[Any, Any]:
    """The least and the greatest value a trial can take for ``key``: its fixed value twice, or its searched ones'."""
    dim = search.get(key)
    if isinstance(dim, Categorical):
        return min(dim.choices), max(dim.choices)
    if isinstance(dim, Range):
        return dim.low, dim.high
    return fixed[key], fixed[key]


def _check_horizons(study: Mapping[str, Any], fixed: Mapping[str, Any], search: Mapping[str, Dimension],
                    problems: _Problems) -> None:  # fmt: skip
    """The step counts that cannot measure what they are for, each added to ``problems``: a warmup as long as the
    short run (the rate never reaches its value: no learning progress, a margin measured during the warmup), and a
    confirmation no longer than the trial it confirms (it would confirm nothing, yet every pick would prefer it)."""
    fewest, most = _extent("max_steps", fixed, search)
    longest_warmup = _extent("warmup_steps", fixed, search)[1]
    if longest_warmup >= fewest:
        problems.add(
            "training.warmup_steps" if "warmup_steps" not in search else "search.warmup_steps",
            f"{longest_warmup} is not below max_steps {fewest}: the rate would never reach its value, so the trial "
            "would measure the warmup",
            f"give fewer warmup steps than max_steps, e.g. {fewest // 10}",
        )
    confirm = study.get("confirm_steps")
    if confirm is not None and confirm <= most:
        problems.add(
            "study.confirm_steps",
            f"{confirm} is not longer than the trial's max_steps {most}: a confirmation must run longer than the "
            "trial it confirms",
            f"give more than {most}, e.g. {10 * most}, or leave it out (10x max_steps)",
        )


def parse_space(raw: Any, path: str = "<space>", overridden: frozenset[str] = frozenset()) -> SearchSpace:
    """Validate a raw mapping (as read from YAML) into a :class:`SearchSpace`.

    Args:
        raw: The YAML document.
        path: Named in every message.
        overridden: Dotted keys (``training.r``) set by ``--set``, blamed on ``--set`` in messages.

    Raises:
        SpaceError: With every problem found, one line each (file, key, what is wrong, the fix).
    """
    problems = _Problems(path, overridden)
    if not isinstance(raw, dict):
        problems.add(
            "(top level)",
            f"expected a mapping of sections, got {type(raw).__name__}",
            "start from search_spaces/demo.yaml",
        )
        raise SpaceError(problems.lines)
    for key in raw:
        if key not in _TOP_KEYS:
            problems.add(str(key), "unknown section", _suggest(str(key), list(_TOP_KEYS)))
    sections = {name: _parse_section(name, raw.get(name), problems) for name in _SECTION_KEYS}

    training = raw.get("training")
    fixed = _parse_training(training, problems)
    memory_limit_auto = bool(fixed.pop(AUTO_KEY, False))
    search = _parse_search(raw.get("search"), training, fixed, problems)
    if not problems.lines:
        _check_horizons(sections["study"], fixed, search, problems)
    if problems.lines:
        raise SpaceError(problems.lines)

    _resolve_data_path(sections["dataset"], path, "dataset.path" in overridden)
    model, dataset = _from_yaml(ModelSpec, sections["model"]), _from_yaml(DatasetSpec, sections["dataset"])
    fixed.update(_first_choices(search))  # the base config holds each searched key at its first choice
    fixed["target_modules"] = tuple(fixed["target_modules"])
    return SearchSpace(
        path=path,
        study=_from_yaml(StudySpec, sections["study"]),
        model=model,
        dataset=dataset,
        base=_from_yaml(TrialConfig, fixed, model=model, dataset=dataset),
        search=MappingProxyType(search),
        overridden=overridden,
        memory_limit_auto=memory_limit_auto,
    )


#: Suffixes of the local data files a dataset path names (the others are the built-in corpus or a hub id).
_LOCAL_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def _resolve_data_path(section: dict[str, Any], space_path: str, from_command_line: bool) -> None:
    """Make a relative local ``dataset.path`` absolute, in place: against the space file's folder when the file gave
    it (a space file means the same data from any folder), against the working directory when ``--set`` did (as
    any path typed on a command line). The study stores the absolute path its trials read, so ``sweep confirm`` from
    another folder reads the same file. The built-in corpus and hub ids are left as they are."""
    value = section.get("path")
    if not isinstance(value, str) or not value.lower().endswith(_LOCAL_DATA_SUFFIXES):
        return
    given = Path(value).expanduser()
    if given.is_absolute():
        return
    base = Path.cwd() if from_command_line or space_path.startswith("<") else Path(space_path).resolve().parent
    section["path"] = str(base / given)


def load_space(path: str | Path, overrides: list[str] | None = None) -> SearchSpace:
    """Read and validate a space file, then apply ``--set`` overrides.

    Args:
        path: A YAML file shaped as in ``docs/contract.md``.
        overrides: ``key=value`` strings, see :func:`apply_overrides`.

    Raises:
        SpaceError: The file is missing, not YAML, or has any invalid key or value (all listed at once).
    """
    path = Path(path)
    if path.is_dir():
        raise SpaceError(f"{path}: (file): is a directory; give a space file, e.g. search_spaces/demo.yaml")
    if not path.exists():
        raise SpaceError(f"{path}: (file): no such file; give the path of a space file, e.g. search_spaces/demo.yaml")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except _DuplicateKeyError as exc:
        raise SpaceError(f"{path}: line {exc.line}: key '{exc.key}' appears twice in one mapping; keep one") from None
    except RecursionError:
        raise SpaceError(
            f"{path}: (file): nested too deeply to be a space file; start from search_spaces/demo.yaml"
        ) from None
    except OSError as exc:
        raise SpaceError(f"{path}: (file): cannot be read ({exc.strerror}); check the path and permissions") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(file)"
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpaceError(f"{path}: {where}: {problem}; fix the YAML syntax there") from None
    except UnicodeDecodeError:
        raise SpaceError(f"{path}: (file): not UTF-8 text; save the space file as UTF-8") from None
    if raw is None:
        raise SpaceError(f"{path}: (file): empty; start from search_spaces/demo.yaml")
    overridden: frozenset[str] = frozenset()
    if overrides:
        if not isinstance(raw, dict):
            parse_space(raw, str(path))
        raw, overridden = apply_overrides(raw, overrides)
    return dataclasses.replace(parse_space(raw, str(path), overridden), set_items=tuple(overrides or ()))


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, line: int):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects a key repeated in one mapping (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
