"""What a study's measurements mean: the settings that change what a trial measures (the data, the model, the
horizon, the learning rate, the fixed training keys, the memory cap), kept in the study itself, so that a resume under
other settings is never mixed silently with what was measured before.

A study holds a list of *setups* (the study attribute :data:`StudyAttr.SETUPS`, each a flat dict of settings such as
``{"max_steps": 10, "dataset.path": "/abs/data.jsonl", "dataset.sha256": "...", ...}``) and the index of the one its
latest ``sweep run`` measured (:data:`StudyAttr.CURRENT_SETUP`); each trial stores the index it was measured under
(:data:`TrialAttr.SETUP`). ``sweep run`` on an existing study (:func:`choose_setup`):

- with the same settings, resumes the setup they match (an earlier one too: going back to an earlier cap resumes it);
- with another ``memory_limit_gib`` and nothing else changed, starts a new setup with a note, as before;
- with any other setting changed, is refused with one line naming each difference, unless ``--new-setup`` asks to
  record the change as a new setup, or nothing was measured under the current settings yet (every trial of them was
  interrupted): they are then replaced.

Readers (the front, the picks, ``sweep confirm``'s candidates, ``sweep export``) compare the trials of the current
setup only (:meth:`sweeper.study._snapshot.StudySnapshot.current`); trials of the others stay in the study and in the
report's tables, with a note (:func:`sweeper.report._front_text.other_setups_line`). Keys of run policy (timeouts,
retries, the preflight's margin, workers) may change freely: :meth:`sweeper.space.TrialConfig.measured` leaves them out.

A study written before setups existed has no :data:`StudyAttr.SETUPS`: its first setup is the settings of its latest
measured trial's stored config (no data checksum), and its trials belong to the setup their configs match.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import optuna

from sweeper.errors import StudyError
from sweeper.space import RUN_POLICY_KEYS, SearchSpace, TrialConfig
from sweeper.storage import StudyAttr, TrialAttr, redact_url

#: The setting that may change on a resume without ``--new-setup`` (a new setup, with a note).
CAP_KEY = "memory_limit_gib"

#: The data's checksum in a setup (a local file's sha256); when two setups both have one, the data is the same file
#: content wherever it lies (a copied project folder), and ``dataset.path`` is not compared.
DATA_SHA_KEY = "dataset.sha256"

#: A local checkpoint's fingerprint in a setup (:func:`checkpoint_fingerprint`); when two setups both have one and it
#: is equal, ``model.name_or_path`` is not compared (the same checkpoint in another folder).
MODEL_SHA_KEY = "model.fingerprint"

#: Each checksum and the path it stands for.
_CHECKSUMS = {DATA_SHA_KEY: "dataset.path", MODEL_SHA_KEY: "model.name_or_path"}


def checkpoint_fingerprint(path: str) -> str | None:
    """A local checkpoint folder's fingerprint: the sha256 of its ``config.json`` and of the names and sizes of its
    weight files (hashing gigabytes of weights at every resume would cost minutes), or None for anything else."""
    folder = os.path.expanduser(path)
    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        return None
    digest = hashlib.sha256()
    with open(config, "rb") as f:
        digest.update(f.read())
    for name in sorted(os.listdir(folder)):
        if name.endswith((".safetensors", ".bin", ".gguf")):
            digest.update(f"{name}:{os.path.getsize(os.path.join(folder, name))}".encode())
    return digest.hexdigest()


def file_sha256(path: str) -> str | None:
    """The sha256 of a local file's bytes (hex), or None when ``path`` is not a file (a built-in dataset, a hub id).

    Raises:
        OSError: The file exists and cannot be read.
    """
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def setup_settings(config: TrialConfig, searched: Iterable[str]) -> dict[str, Any]:
    """The settings of ``config`` that change what a trial measures, flat (``model.name_or_path``,
    ``dataset.path``, ``max_steps``, ...): :meth:`TrialConfig.measured` without the run policy keys and without the
    ``searched`` keys (those are the trial's parameters, not its setup). Lists become lists (JSON-ready)."""
    flat: dict[str, Any] = {}
    for key, value in config.measured().to_dict().items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key in (*searched, *RUN_POLICY_KEYS):
        flat.pop(key, None)
    path = str(flat.get("dataset.path", ""))
    if path and not os.path.isabs(path) and os.path.exists(path):
        flat["dataset.path"] = os.path.abspath(path)  # older versions stored a relative path as given
    return flat


def space_settings(space: SearchSpace) -> dict[str, Any]:
    """The setup ``sweep run`` would measure ``space`` under: :func:`setup_settings` its base config, and the data's
    :func:`file_sha256` when the dataset is a local file."""
    flat = setup_settings(space.base, space.search)
    sha = file_sha256(space.base.dataset.path)
    if sha is not None:
        flat[DATA_SHA_KEY] = sha
    fingerprint = checkpoint_fingerprint(space.base.model.name_or_path)
    if fingerprint is not None:
        flat[MODEL_SHA_KEY] = fingerprint
    return flat


def differences(was: Mapping[str, Any], now: Mapping[str, Any], *, cap: bool = True, word: str = "was") -> list[str]:
    """``key <now's value> (<word> <was's value>)`` for each setting that differs, in ``now``'s order;
    ``dataset.path`` is left out when both name data of the same checksum, and the checksum is shown only when the
    paths are equal (the file changed in place); without ``cap``, ``memory_limit_gib`` is left out. A key only one of
    them has (a setting of another version's schema) is not a difference."""
    same = {
        path: key in was and key in now and was[key] == now[key] for key, path in _CHECKSUMS.items()
    }  # the same bytes (data) or the same checkpoint (model) under another path
    out = []
    for key in dict.fromkeys([*now, *was]):
        if key in _CHECKSUMS:
            path = _CHECKSUMS[key]
            if key in was and key in now and not same[path] and was.get(path) == now.get(path):
                out.append(f"the content of {now.get(path)} ({key} {str(now[key])[:12]}, {word} {str(was[key])[:12]})")
            continue
        if same.get(key) or (key == CAP_KEY and not cap):
            continue
        if key not in was or key not in now:  # a setting one of them does not know (another version's schema)
            continue
        if _same(was[key], now[key]):
            continue
        out.append(f"{key} {_shown(now[key])} ({word} {_shown(was[key])})")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return list(a) == list(b) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else a == b


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "[]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _baseline(study: optuna.Study) -> dict[str, Any] | None:
    """The setup of a study written before setups existed: its latest finished trial's stored config (a repeat's
    is its original's), or None. A local model or data path that no longer exists is left out (the project moved,
    or the tests' tiny model was rebuilt elsewhere): what it held cannot be compared any more."""
    for t in reversed(study.get_trials(deepcopy=False)):
        raw = t.user_attrs.get(TrialAttr.CONFIG)
        if t.state.is_finished() and isinstance(raw, Mapping) and TrialAttr.STATUS in t.user_attrs:
            try:
                settings = setup_settings(TrialConfig.from_dict(raw), t.params)
            except (TypeError, ValueError):
                continue
            for key in _CHECKSUMS.values():
                value = str(settings.get(key, ""))
                if value.startswith(("/", "~", ".")) and not os.path.exists(os.path.expanduser(value)):
                    settings.pop(key, None)
            return settings
    return None


def stored_setups(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's setups (:data:`StudyAttr.SETUPS`), or for a study written before them its :func:`_baseline` (or
    nothing, for a study with no measured trial)."""
    raw = study.user_attrs.get(StudyAttr.SETUPS)
    if isinstance(raw, list) and all(isinstance(s, dict) for s in raw):
        return [dict(s) for s in raw]
    baseline = _baseline(study)
    return [baseline] if baseline is not None else []


def current_setup(study: optuna.Study) -> int | None:
    """The index of the setup the study's latest ``sweep run`` measured, or None for a study written before setups
    (whose trials are all compared, as before)."""
    raw = study.user_attrs.get(StudyAttr.CURRENT_SETUP)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def choose_setup(study: optuna.Study, space: SearchSpace, url: str, *, new_setup: bool = False) -> int:
    """The setup this run measures: the stored one its settings match, else a new one (a changed
    ``memory_limit_gib`` alone, or any change with ``new_setup``), recorded in the study as its current setup.

    Args:
        study: The opened study.
        space: The space about to run.
        url: The storage URL, for the message (its password is not shown).
        new_setup: ``sweep run --new-setup``: record changed settings as a new setup instead of refusing them.

    Returns:
        The index of the setup in :data:`StudyAttr.SETUPS`; the run's trials store it as :data:`TrialAttr.SETUP`.

    Raises:
        StudyError: Settings other than ``memory_limit_gib`` differ from the study's current setup and ``new_setup``
            is False: one line naming each difference and the two ways on.
    """

    now = space_settings(space)
    setups = stored_setups(study)
    index = next((i for i, s in enumerate(setups) if not differences(s, now)), None)
    if index is None:
        current = current_setup(study)
        was = setups[current if current is not None and current < len(setups) else -1] if setups else None
        changed = differences(was, now, cap=False) if was is not None else []
        at = setups.index(was) if was is not None else -1
        if changed and not new_setup and not _measured_under(study, at):
            # Nothing was measured under the current settings (its trials were all interrupted): there is nothing
            # to mix them with, so they are replaced, and the queued trials run under the new ones.
            setups[at] = now
            study.set_user_attr(StudyAttr.SETUPS, setups)
            study.set_user_attr(StudyAttr.CURRENT_SETUP, at)
            return at
        if changed and not new_setup:
            raise StudyError(
                f"{space.path}: study '{study.study_name}' in {redact_url(url)} was measured with other settings: "
                f"{'; '.join(changed)}; start a new study (--study NAME), or pass --new-setup to measure these "
                "settings in this one, kept apart from the earlier trials in report and export"
            )
        setups.append(now)
        index = len(setups) - 1
        study.set_user_attr(StudyAttr.SETUPS, setups)
    elif study.user_attrs.get(StudyAttr.SETUPS) is None or set(now) - set(setups[index]):
        # Matched a setup that lacks settings this version records (a study written before setups, a checksum not
        # known then): it is completed with them, so that later resumes compare them too.
        setups[index] = {**setups[index], **now}
        study.set_user_attr(StudyAttr.SETUPS, setups)
    if current_setup(study) != index:
        study.set_user_attr(StudyAttr.CURRENT_SETUP, index)
    return index


def unapplied_settings(study: optuna.Study, space: SearchSpace) -> tuple[int | None, list[str]]:
    """For a run that has nothing to run: the study's current setup, left as it is, and the settings of ``space``
    that differ from it (:func:`differences`, the cap included, ``key <space's> (measured <the setup's>)``), which
    this run therefore did not apply. A run that measures nothing never changes what report and export compare.

    Returns:
        The current setup's index (None for a study written before setups), and the differences (empty: the same).
    """
    setups = stored_setups(study)
    if not setups:
        return None, []
    current = current_setup(study)
    index = current if current is not None and current < len(setups) else len(setups) - 1
    return index, differences(setups[index], space_settings(space), word="measured")


class RunSetup(NamedTuple):
    """The setup a ``sweep run`` measures under (:func:`run_setup`).

    Attributes:
        known: How many setups the study had when the run opened it.
        setup: The setup's index in :data:`StudyAttr.SETUPS` (None for a study written before setups).
        unapplied: The settings of the space this run did not apply, ``key new (measured old)``; empty unless the
            run has nothing to run.
    """

    known: int
    setup: int | None
    unapplied: list[str]


def run_setup(
    study: optuna.Study, space: SearchSpace, url: str, *, finished: int, target: int, new_setup: bool = False
) -> RunSetup:
    """The setup a ``sweep run`` of ``space`` measures under: when its study already has ``target`` finished trials
    (nothing to run) and a setup, the current one unchanged with the settings of ``space`` it leaves unapplied
    (:func:`unapplied_settings`: what report and export compare stays as it is); else :func:`choose_setup`'s.

    Args:
        study: The opened study.
        space: The space about to run.
        url: The storage URL, for the message.
        finished: The study's finished trials.
        target: The run's ``n_trials``.
        new_setup: ``sweep run --new-setup``.

    Raises:
        StudyError: As :func:`choose_setup`.
    """
    known = len(stored_setups(study))
    if finished >= target and known > 0:
        index, unapplied = unapplied_settings(study, space)
        return RunSetup(known, index, unapplied)
    return RunSetup(known, choose_setup(study, space, url, new_setup=new_setup), [])


def _measured_under(study: optuna.Study, index: int) -> bool:
    """Whether a trial of the study has a result under setup ``index``: finished with a status, not interrupted (a
    trial without :data:`TrialAttr.SETUP` is an older version's and counts as measured)."""
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished() or TrialAttr.STATUS not in t.user_attrs or t.user_attrs.get(TrialAttr.INTERRUPTED):
            continue
        if t.user_attrs.get(TrialAttr.SETUP, index) == index:
            return True
    return False


def trial_setup(
    attrs: Mapping[str, Any], config: TrialConfig | None, params: Mapping[str, Any], setups: Sequence[Mapping[str, Any]]
) -> int | None:
    """The setup a trial was measured under: its :data:`TrialAttr.SETUP`, else (a trial written before setups) the
    first setup its stored config matches; None when neither says."""
    raw = attrs.get(TrialAttr.SETUP)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if config is None:
        return None
    mine = setup_settings(config, params)
    without_sha = [{k: v for k, v in s.items() if k not in _CHECKSUMS} for s in setups]
    return next((i for i, s in enumerate(without_sha) if not differences(s, mine)), None)
