"""The export formats ``sweep export --format`` knows (:data:`EXPORT_FORMATS`), as peft lists its LoRA layer
dispatchers: each format's module declares its :class:`~sweeper.export._format.ExportFormat` record, and one line here
lists it. The CLI's choices and help, the file suffixes, the renderers and what each format cannot express all read this
list."""

from __future__ import annotations

from sweeper.export._axolotl import AXOLOTL
from sweeper.export._format import ExportFormat
from sweeper.export._hf import HF, TRL
from sweeper.export._json import JSON
from sweeper.export._llama_factory import LLAMA_FACTORY
from sweeper.export._policy import POLICY

#: The export formats, in the order ``sweep export --help`` and a refusal's alternatives list them. A lookup by name
#: takes the first match.
EXPORT_FORMATS: list[ExportFormat] = [HF, TRL, AXOLOTL, LLAMA_FACTORY, JSON, POLICY]


def format_names() -> tuple[str, ...]:
    """The names of :data:`EXPORT_FORMATS`, in order: the choices of ``--format``."""
    return tuple(f.name for f in EXPORT_FORMATS)


def export_format(name: str) -> ExportFormat:
    """The first format of :data:`EXPORT_FORMATS` named ``name``.

    Raises:
        ValueError: No format has that name (``--format`` is checked against :func:`format_names` before).
    """
    for candidate in EXPORT_FORMATS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"no export format {name!r}; the formats are {', '.join(format_names())}")
