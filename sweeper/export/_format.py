"""What an export format declares (:class:`ExportFormat`): its name, file suffix, one-line help, what it cannot express
(:class:`Limit`) and how it renders. Each format's module declares its record; :mod:`._registry` lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sweeper.export._dataset import ExportData
from sweeper.export._settings import ExportSettings
from sweeper.study import StoredTrial


@dataclass(frozen=True, kw_only=True)
class Limit:
    """The trials a format cannot express as they ran (a setting the tool has no key or type for).

    Attributes:
        why: The one-line reason ``trial`` cannot be expressed (``it computed in float32, which ...``), or None when
            it can.
        every: Why no trial of a study can be (``every one computed in float32, which ...``).
        fix: How to get trials it can express (``run trials with ...``).
    """

    why: Callable[[StoredTrial], str | None]
    every: str
    fix: str


@dataclass(frozen=True, kw_only=True)
class ExportFormat:
    """An export format of ``sweep export --format``.

    Attributes:
        name: The ``--format`` value (``hf``, ``axolotl``...).
        suffix: The suffix of its main file, the one ``-o PATH`` names (``.py``, ``.yaml``, ``.json``).
        help: One line for ``sweep export --help``: what the file is.
        render: The files of an export of the settings: ``{suffix: text}`` for the main file and any file beside it
            (``.json`` beside the ``hf`` ``.py``), each stamped with its sha256 when written, and ``{path: text}``
            for data files inside ``ExportData.folder`` (written as they are). ``ExportData`` is given only with
            ``rows``.
        limit: The trials it cannot express, None when it expresses every trial.
        rows: Whether it writes the trial's rows beside its file (``render`` gets them as ``ExportData``).
        offered_instead: Whether a refusal names it as a format that expresses the trial (``json``, a record of the
            settings rather than a training config, is not).
    """

    name: str
    suffix: str
    help: str
    render: Callable[[ExportSettings, ExportData | None], dict[str, str]]
    limit: Limit | None = None
    rows: bool = False
    offered_instead: bool = True

    def cannot_express(self, trial: StoredTrial) -> str | None:
        """Why this format cannot train ``trial`` as it ran (:attr:`Limit.why`), or None when it can."""
        return self.limit.why(trial) if self.limit is not None else None
