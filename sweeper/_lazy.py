"""Package faces that load their names on first use (PEP 562), so that importing a package does not import every
module behind it: the trial process imports ``sweeper.trial._result`` without loading the sweep's launcher."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(
    package: str, homes: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: a public name is imported from its module in
    ``homes`` (public name -> module) on first use and kept in the package's globals.

    Raises (from the returned ``__getattr__``):
        AttributeError: ``package`` has no such public name.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
