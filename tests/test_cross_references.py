"""Every Sphinx cross-reference in sweeper's docstrings and comments (``:func:``, ``:class:``, ``:mod:``, ``:meth:``,
``:attr:``, ``:data:``, ``:exc:``, ``:obj:``) names a place that exists: after a move, a reference to the old place
fails here instead of sending a reader nowhere (issue 56 found 63 such). A name resolves as Sphinx would find it from
the module it is written in: a dotted path that imports (``sweeper.study._front.non_dominated``; relative
``._records``), a name of the module or a member of one of its classes (``to_dict``), a name of its package's face or
of a module beside it, or a builtin.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ROLE = re.compile(r":(func|class|mod|data|meth|attr|exc|obj):`~?([^`<]+?)(?:\s*<([^>]+)>)?`")


def members(cls):
    names = set(dir(cls)) | set(getattr(cls, "__annotations__", {}))
    try:
        names |= set(re.findall(r"self\.(\w+)\s*[:=]", inspect.getsource(cls)))
    except (OSError, TypeError):
        pass
    return names


_FOUND = object()


def walk(obj, parts):
    """What ``obj.parts`` names (``_FOUND`` for a class's instance attribute or a value of None), or None."""
    for p in parts:
        if inspect.isclass(obj) and p in members(obj) and not hasattr(obj, p):
            return _FOUND
        if not hasattr(obj, p):
            return None
        obj = getattr(obj, p)
    return _FOUND if obj is None else obj


def importable(parts):
    for i in range(len(parts), 0, -1):
        try:
            m = importlib.import_module(".".join(parts[:i]))
        except Exception:
            continue
        if walk(m, parts[i:]) is not None:
            return True
    return False


def resolve(target, module):
    target = re.sub(r"\s+|#:", "", target).rstrip("()")
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    if target.startswith("."):
        return importable((package + target).split("."))
    parts = target.split(".")
    if hasattr(builtins, target):
        return True
    if walk(module, parts) is not None:
        return True
    if len(parts) <= 2:  # a member of a class of this module, or a name of this package (its face or a sibling)
        for cls in [v for v in vars(module).values() if inspect.isclass(v) and v.__module__ == module.__name__]:
            if parts[-1] in members(cls) and (len(parts) == 1 or parts[0] == cls.__name__):
                return True
        pkg = importlib.import_module(package)
        siblings = [pkg] + [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
        if any(walk(s, parts) is not None for s in siblings):
            return True
    return importable(parts)


def _unresolved() -> tuple[int, list[str]]:
    bad, n = [], 0
    for path in sorted((REPO / "sweeper").rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        text = path.read_text()
        for m in ROLE.finditer(text):
            n += 1
            if not resolve(m.group(3) or m.group(2), module):
                bad.append(f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}")
    return n, bad


def test_every_cross_reference_names_a_place_that_exists():
    n, bad = _unresolved()
    assert n > 1000  # the scan sees the references
    assert bad == [], f"{len(bad)} of {n} cross-references name nothing:\n" + "\n".join(bad)


def test_a_reference_to_nothing_is_caught():
    import sweeper.study._snapshot as module

    assert resolve("sweeper.study._front.non_dominated", module) and resolve("StudySnapshot.current", module)
    assert not resolve("sweeper.study.non_dominated", module) and not resolve("in_current_setup", module)


def test_the_benchmarks_index_names_every_script_and_every_name_is_a_script():
    """benchmarks/README.md (issue 69: 28 scripts in one folder, two named by nothing) names each script and module of
    benchmarks/ once, by its path under benchmarks/ (``stability/validity.py``), and names no script that is not
    there."""
    root = REPO / "benchmarks"
    index = (root / "README.md").read_text()
    scripts = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in (".py", ".sh")}
    assert {"_common.py", "stability/validity.py", "tooling/parity.sh", "tooling/same_outputs.sh"} <= scripts
    named = re.findall(r"^\| `([\w./-]+\.(?:py|sh))` \|", index, flags=re.MULTILINE)
    assert len(named) == len(set(named)), f"benchmarks/README.md names a script twice: {sorted(named)}"
    assert scripts - set(named) == set(), f"benchmarks/README.md does not name {sorted(scripts - set(named))}"
    unknown = sorted(set(named) - scripts)
    assert unknown == [], f"benchmarks/README.md names scripts that are not there: {unknown}"
