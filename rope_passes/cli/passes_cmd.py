"""``rope-passes passes``: list the passes and the presets."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from rope_passes.cli import output_console
from rope_passes.passes import ALL_PASSES
from rope_passes.pipeline import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("passes", help="list passes and target presets")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = output_console()
    table = Table(title="passes", title_justify="left")
    table.add_column("name")
    table.add_column("what it does")
    table.add_column("options")
    for name, cls in ALL_PASSES.items():
        opts = "\n".join(f"{o.name}: {o.type} = {o.default!r} — {o.help}" for o in cls.option_infos())
        table.add_row(escape(name), escape(cls.summary), escape(opts or "-"))
    console.print(table)
    for target, names in PRESETS.items():
        console.print(f"--target {target}: " + " → ".join(names))
    return 0
