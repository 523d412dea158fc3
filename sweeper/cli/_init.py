"""``sweep init --from FILE``: a space file from the user's own training config, with the table of what became of
each of its keys (:func:`sweeper.export.space_from`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sweeper.cli._common import _print
from sweeper.errors import SpaceError


def cmd_init(args: argparse.Namespace) -> int:
    """Read ``--from``, print each of its keys (carried, translated, a tool default, not carried with the reason),
    write the space (refusing to replace one without ``--force``) and check that it loads."""
    from sweeper.export import space_from
    from sweeper.export.production import ProductionConfigError, read_production
    from sweeper.space import load_space

    out = Path(args.output or "space.yaml")
    if out.exists() and out.resolve() == Path(args.source).resolve():
        raise SpaceError(f"{out}: -o names the config read (--from); write the space to another path")
    if out.exists() and not args.force:
        raise SpaceError(f"{out}: exists; pass --force to replace it, or -o another path")
    try:
        reading = read_production(args.source)
        made = space_from(reading)
    except (ProductionConfigError, ValueError) as exc:
        raise SpaceError(f"--from: {exc}") from None
    width = max(len(row[0]) for row in made.table) if made.table else 10
    defaults = sum(1 for row in made.table if row[2] == "tool default")
    _print(
        f"{args.source}: read as {reading.tool}; {len(made.table) - defaults} keys, and {defaults} settings it leaves "
        f"at {reading.tool}'s defaults"
    )
    for key, value, what, where in made.table:
        _print(f"  {key:<{width}}  {value:<24}  {what:<12}  {where}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.yaml")
    tmp.write_text(made.text)
    try:
        load_space(tmp)  # the space validates before it replaces anything
    except SpaceError as exc:
        tmp.unlink()
        first = str(exc).split(": ", 1)[-1]
        raise SpaceError(f"--from: {args.source}: its values make no valid space ({first}); fix the file") from None
    os.replace(tmp, out)
    for line in made.warnings:
        _print(f"note: {line}")
    study = load_space(out).study.name
    _print(
        f"wrote {out} (study {study}): 'sweep run {out}' measures the file's own settings first, then searches; "
        f"'sweep export {study} --onto {args.source}' writes the answer back"
    )
    return 0
