"""``rope-passes passes``: list the passes and the presets, per WebGPU runtime (:mod:`rope_passes.runtimes`)."""

from __future__ import annotations

import argparse

from rope_passes.cli import add_command, output_console


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "passes", help="list passes and presets",
                    description="Lists every pass (what it does, its options) and, per WebGPU runtime, the passes "
                    "each --preset runs there and those it leaves out, and why.",
                    exits=("0  listed",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from rope_passes.passes import ALL_PASSES
    from rope_passes.plan import runtime_presets, skipped_for
    from rope_passes.runtimes.installed import default_runtime
    from rope_passes.runtimes.probed import probed_runtime

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
        console.print(f"--runtime {runtime}{mark}: {probed_runtime(runtime).label}", highlight=False)
        for preset, names in presets.items():
            console.print(f"  --preset {preset}: " + " → ".join(names), highlight=False, soft_wrap=True)
            for name, why in skipped_for(preset, runtime).items():
                console.print(f"      {name} left out: {why}", highlight=False, soft_wrap=True)
    return 0
