"""``--set KEY=VALUE``: the command line's values applied to a space file's YAML before it is parsed, each blamed on
``--set`` in messages.
"""

from __future__ import annotations

from typing import Any

import yaml

from sweeper.errors import SpaceError
from sweeper.space._values import _SECTION_KEYS, TRIAL_KEYS, _Problems, _suggest


def _parse_override(item: str, problems: _Problems) -> tuple[str, str, Any] | None:
    """``key``, the value's text and the value (parsed as YAML, else the text itself) of one ``--set key=value``;
    None, with the problem added to ``problems``, when it is not of that form or its value is empty."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        problems.add(item, "not of the form key=value", "write --set r=16")
        return None
    if not text.strip():
        problems.add(key, "empty value", f"write {key}=VALUE")
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    return key, text, value


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], file: str = "--set"
) -> tuple[dict[str, Any], frozenset[str]]:
    """Apply ``--set key=value`` overrides to a raw space mapping (before validation).

    A bare key is a per-trial key (it replaces ``search.<key>`` or ``training.<key>``, so a searched key becomes
    fixed); ``study.``/``model.``/``dataset.`` keys are dotted. Values are parsed as YAML (``true``, ``1e-4``,
    ``[a, b]``).

    Returns:
        The new mapping (the input is not modified) and the dotted keys that were set (``training.r``).

    Raises:
        SpaceError: A malformed override, an empty value, an unknown key (with the nearest valid key), or a key set
            twice to different values (``--set r=4 --set r=8``: one of them would be ignored).
    """
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    problems = _Problems(file)
    overridden: set[str] = set()
    given: dict[str, str] = {}  # dotted key -> the text first given for it

    def repeated(dotted: str, shown: str, value: str) -> bool:
        """Whether ``dotted`` was set before to another value (an error: one of the two would be ignored)."""
        first = given.setdefault(dotted, value)
        if first != value:
            problems.add(shown, f"set twice ({first}, then {value})", f"give --set {shown}=VALUE once")
            return True
        return False

    for item in overrides:
        parsed = _parse_override(item, problems)
        if parsed is None:
            continue
        key, text, value = parsed
        section, dot, leaf = key.partition(".")
        if dot and section in _SECTION_KEYS:
            if leaf not in _SECTION_KEYS[section]:
                problems.add(key, "unknown key", _suggest(leaf, list(_SECTION_KEYS[section])))
                continue
            if repeated(f"{section}.{leaf}", key, text.strip()):
                continue
            sec = raw.get(section)
            if sec is not None and not isinstance(sec, dict):
                continue  # a section of the wrong type: parse_space reports it
            raw[section] = dict(sec) if isinstance(sec, dict) else {}
            raw[section][leaf] = value
            overridden.add(f"{section}.{leaf}")
            continue
        if dot and section in ("training", "search"):
            key = leaf
        if key not in TRIAL_KEYS:
            valid = list(TRIAL_KEYS) + [f"{s}.{k}" for s, ks in _SECTION_KEYS.items() for k in ks]
            problems.add(key, "unknown key", _suggest(key, valid))
            continue
        if repeated(f"training.{key}", key, text.strip()):
            continue
        for name in ("search", "training"):
            if raw.get(name) is None:
                raw[name] = {}
        if not isinstance(raw["search"], dict) or not isinstance(raw["training"], dict):
            continue  # a section of the wrong type: parse_space reports it, the override cannot apply
        raw["search"].pop(key, None)
        raw["training"][key] = value
        overridden.add(f"training.{key}")
    if problems.lines:
        raise SpaceError(problems.lines)
    return raw, frozenset(overridden)
