"""``rope-passes passes``: list the passes and the presets, per WebGPU runtime (:mod:`rope_passes.targets`)."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from rope_passes.cli import output_console
from rope_passes.passes import ALL_PASSES
from rope_passes.pipeline import runtime_presets, skipped_for
from rope_passes.targets import default_runtime, get_target


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
    installed = default_runtime()
    for runtime, presets in runtime_presets().items():
        mark = " (installed: the default)" if runtime == installed else ""
        console.print(f"--runtime {runtime}{mark}: {get_target(runtime).label}", highlight=False)
        for target, names in presets.items():
            console.print(f"  --target {target}: " + " → ".join(names), highlight=False, soft_wrap=True)
            for name, why in skipped_for(target, runtime).items():
                console.print(f"      {name} left out: {why}", highlight=False, soft_wrap=True)
    return 0
