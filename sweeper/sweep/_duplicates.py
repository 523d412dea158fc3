"""Whether a configuration was already measured (:mod:`sweeper.sweep._running` settles a repeat with it):
:func:`find_duplicate` compares a trial with the study's measured ones as their devices train them, the
rows included where the data's longest rows decide the measurement. Pure reads of a snapshot; nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.space import TrialConfig
from sweeper.storage import TrialAttr
from sweeper.study import StudyLike, snapshot

#: Settings that move only the CUDA allocator: on the CPU two configurations that differ in them alone are one
#: measurement (issue 68: ``expandable_segments`` searched on the CPU was warned about, then measured twice).
CUDA_ONLY_KEYS = ("expandable_segments",)


def _same_rows(
    params: Mapping[str, Any], config: TrialConfig | None, longest: int | None, cpu: bool = False
) -> dict[str, Any]:
    """``params`` with a searched ``max_seq_length`` at the length its rows are trained at
    (:meth:`TrialConfig.worst_case_length`): values at or above the data's longest sample compare equal; on the
    ``cpu``, without :data:`CUDA_ONLY_KEYS`."""
    out = {k: v for k, v in params.items() if not (cpu and k in CUDA_ONLY_KEYS)}
    if config is not None and "max_seq_length" in out:
        out["max_seq_length"] = config.worst_case_length(longest)
    return out


def _on_device(config: TrialConfig, cpu: bool) -> TrialConfig:
    """``config`` as the device trains it: on the ``cpu``, :data:`CUDA_ONLY_KEYS` at their defaults."""
    return replace(config, expandable_segments=False) if cpu else config


def find_duplicate(
    study: StudyLike,
    params: Mapping[str, Any],
    config: TrialConfig | None = None,
    setup: int | None = None,
    longest_sample_tokens: int | None = None,
    cpu: bool = False,
) -> FrozenTrial | None:
    """A COMPLETE or PRUNED trial with these params (or params that train the same rows) and a result of its own, or
    None. On the ``cpu`` (trials measured there), settings that move only the CUDA allocator
    (:data:`CUDA_ONLY_KEYS`) are left out of the comparison: they change nothing a CPU trial measures.

    TPE re-proposes configurations it already measured, often in small categorical spaces; a trial's outcome is
    deterministic up to measurement noise (fixed seed, same samples), so a repeat costs GPU time and teaches nothing.
    FAIL trials (timeout, crash, error) are not reused: they may go differently another time. With ``config``, the
    earlier trial must also have been measured with the same settings (:meth:`sweeper.space.TrialConfig.measured`:
    run policy such as ``trial_timeout`` or ``max_retries`` aside): a study resumed with another
    ``memory_limit_gib``, learning rate or dataset measures its configurations again. With ``setup``, the earlier
    trial must have been measured under that setup too (:mod:`sweeper.study._setups`: the data file's content may
    have changed under the same path). With ``longest_sample_tokens`` (the data's longest tokenized sample) and
    ``config``, a ``max_seq_length`` at or above it is the same as any other such value
    (:meth:`TrialConfig.as_trained`): the trials pad each micro-batch to its longest row, so both train the same rows
    at the same shapes (not when samples are packed: a packed row fills up to ``max_seq_length``).
    """
    longest = longest_sample_tokens if config is not None else None
    want = _on_device(config.as_trained(longest).measured(), cpu) if config is not None else None
    mine = _same_rows(params, config, longest, cpu)
    for t in snapshot(study).trials_in((TrialState.COMPLETE, TrialState.PRUNED)):
        if TrialAttr.STATUS not in t.user_attrs or t.frozen is None:
            continue
        exact = t.params == params or (
            cpu and _same_rows(t.params, None, None, cpu) == _same_rows(params, None, None, cpu)
        )
        if not exact and (longest is None or _same_rows(t.params, t.config, longest, cpu) != mine):
            continue
        if setup is not None and t.user_attrs.get(TrialAttr.SETUP, setup) != setup:
            continue
        if want is not None and config is not None:
            if t.config is None:
                continue
            theirs = t.config
            if setup is not None and t.user_attrs.get(TrialAttr.SETUP) == setup:
                # The setup compared the data by content and a local checkpoint by fingerprint: the same files
                # under another path (a copied project folder) are the same measurement.
                theirs = replace(
                    theirs,
                    dataset=replace(theirs.dataset, path=config.dataset.path),
                    model=replace(theirs.model, name_or_path=config.model.name_or_path),
                )
            if _on_device(theirs.as_trained(longest).measured(), cpu) != want:
                continue
        return t.frozen
    return None
