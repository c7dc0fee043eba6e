"""``rope-passes inspect MODEL [MODEL ...] [--runtime R] [--json]``: the RoPE census of each model (file or genai
folder), and what each WebGPU runtime does with it.

The census itself is :func:`rope_passes.analysis.census.census`; the per-runtime verdict ("loads; capture-ready",
"does not load: ...", "loads; capture blocked by ...", "loads; capture unknown: run `check --graph-capture`") is the
one home every command reads (:func:`rope_passes.analysis.placement.capture_verdict`,
:meth:`~rope_passes.analysis.placement.Placement.verdict`) for every runtime target (:mod:`rope_passes.runtimes`),
or the one ``--runtime`` names. This module parses the arguments and prints it: JSON, or :func:`render` (one compact
rich table per model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from rope_passes.cli import RUNTIMES, add_command, add_runtime_argument, output_console

if TYPE_CHECKING:  # the census imports onnx_ir: only when the command runs (``--help`` imports nothing heavy)
    from rope_passes.analysis.census import DynamicNode, GraphInput, RopeCensus


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "inspect", help="RoPE census of a model: attention op, caches, flavour, positions",
                    description="Prints the RoPE census of each model (file or genai folder): attention op and its "
                    "attributes, rotary flavour, cos/sin caches, where positions and total_sequence_length come "
                    "from, what blocks graph capture; then what each WebGPU runtime does with it (loads, "
                    "capture-ready, or what blocks it; a static prediction). Weights are never read.",
                    exits=("0  printed (a census is information: nothing in it fails the command)",))
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="model.onnx or a model folder (model + genai_config.json); several give a census each")
    p.add_argument("--json", action="store_true",
                   help="print JSON: one object for one model, a list of objects for several")
    add_runtime_argument(p, "show what this WebGPU runtime does with the model",
                         default="every runtime, the one installed here marked")
    p.set_defaults(func=run)


def runtime_verdicts(model, runtimes: list[str]) -> list[dict[str, Any]]:
    """Per runtime: loads / capture-ready / blocked by what (static prediction, capture on)."""
    from rope_passes.analysis.placement import capture_verdict
    from rope_passes.runtimes.installed import detect_installed
    from rope_passes.runtimes.probed import probed_runtime

    here = detect_installed()
    out = []
    for name in runtimes:
        target = probed_runtime(name)
        placement = capture_verdict(model, target)  # the one home of the capture verdict (lint, optimize read it)
        installed = here is not None and here.runtime == name
        out.append({"runtime": name, "label": target.label, "installed": installed,
                    # what is installed beside rope-passes, when it is this runtime (its versions may not be the
                    # probed table's); every verdict is a prediction from the probed table, never a session
                    "installed_label": here.label if installed and here is not None else None, "predicted": True,
                    "loads": placement.loads, "capture_ready": placement.state == "ready",
                    "capture": placement.state, "memcpy": len(placement.memcpy), "verdict": placement.verdict(),
                    "blockers": [{"node": n, "why": w} for n, w in placement.blockers()],
                    "downlevel": list(target.downlevel_for(model))})
    return out


def run(args: argparse.Namespace) -> int:
    from rope_passes.analysis.census import census
    from rope_passes.io import load_bundle

    results = []
    runtimes = [args.runtime] if args.runtime else list(RUNTIMES)
    for path in args.models:
        bundle = load_bundle(path)
        results.append((census(bundle.model, bundle.genai_config, source=str(path)),
                        runtime_verdicts(bundle.model, runtimes)))
    try:
        if args.json:
            data = [{**c.to_dict(), "runtimes": v} for c, v in results]
            print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
            return 0
        console = output_console()
        for i, (result, verdicts) in enumerate(results):
            if i:
                console.print()
            render(result, console, verdicts)
        sys.stdout.flush()
    except BrokenPipeError:  # `rope-passes inspect ... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# ------------------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------------------


def _fmt_shape(shape: list | None) -> str:
    return "?" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def _inputs_line(inputs: list[GraphInput]) -> str:
    past = [i for i in inputs if i.name.startswith(("past_key_values", "past_"))]
    rest = [f"{i.name}{_fmt_shape(i.shape)}" for i in inputs if i not in past]
    if past:
        rest.append(f"past ×{len(past)}")
    return ", ".join(rest)


def render(c: RopeCensus, console, verdicts: list[dict[str, Any]] | None = None) -> None:
    """Print the census as one compact table (rich ``Console``), then one row per runtime verdict."""
    from rich.markup import escape
    from rich.table import Table

    opsets = " ".join(f"{k} {v}" for k, v in c.opsets.items())
    sub = f" (+{c.subgraph_node_count} in subgraphs)" if c.subgraph_node_count else ""
    title = f"{c.source or 'model'}  ·  ir {c.ir_version}  ·  opsets {opsets}  ·  {c.node_count} nodes{sub}"
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    add_row = table.add_row

    def add_escaped_row(key: str, value: str) -> None:
        add_row(key, escape(value))

    table.add_row = add_escaped_row  # type: ignore[method-assign, assignment]  # (key, value) rows, values escaped

    table.add_row("rope", ", ".join(c.flavours) or "none found")
    if not c.attention:
        table.add_row("attention", "none")
    for g in c.attention:
        bits = [f"{g.op_type} ×{g.count}", f"heads {g.num_heads}/{g.kv_num_heads}",
                f"head_size {g.head_size}" + (" (genai_config)" if g.head_size_source == "genai_config" else "")]
        if g.do_rotary is not None:
            bits.append(f"do_rotary={g.do_rotary}")
        if g.rotary_interleaved is not None:
            bits.append(f"rotary_interleaved={g.rotary_interleaved}")
        bits.append("packed QKV" if g.packed_qkv else "separate Q/K/V")
        bits.append(f"{g.num_inputs} inputs")
        table.add_row("attention", ", ".join(bits))
        if g.total_sequence_length:
            table.add_row("  total_seq", g.total_sequence_length)
    for r in c.rotary:
        bits = [f"{r.op_type} ×{r.count}", f"interleaved={r.interleaved}",
                f"rotary_dim={r.rotary_embedding_dim}", f"num_heads {r.num_heads}"]
        if r.mrope_section is not None:
            bits.append(f"mrope_section {r.mrope_section}")
        if r.mrope_layout is not None:
            bits.append(f"mrope_layout={r.mrope_layout} ({'interleaved' if r.mrope_layout == 1 else 'sectioned'})")
        table.add_row("rotary", ", ".join(bits))
        if r.position_source:
            table.add_row("  positions", r.position_source)
    for m in c.manual_mrope:
        layouts: dict[int | None, str] = {0: "sectioned", 1: "interleaved"}
        layout = layouts.get(m.layout, "?")
        table.add_row("manual mRoPE", f"{m.variant}, sections {m.sections}, layout {m.layout} ({layout}), "
                                      f"from {m.table_source}, feeds {len(m.feeds)} nodes")
    for f in c.inv_freq:
        table.add_row("inv_freq", f"{f.inv_freq}{_fmt_shape(f.inv_freq_shape)} → {len(f.matmuls)} MatMul → "
                                  f"Cos ×{f.cos_nodes} / Sin ×{f.sin_nodes}; positions from "
                                  f"{', '.join(f.positions_from) or '?'}")
    ctx = f"context_length {c.context_length}" if c.context_length is not None else "context_length unknown"
    if not c.caches:
        table.add_row("caches", f"none ({ctx})")
    for k in c.caches:
        extra = f" {k.variant}" if k.variant else ""
        versus = f", {k.rows_vs_context}" if k.rows_vs_context else ""
        table.add_row("cache", f"{k.role}{extra}: {k.name} {_fmt_shape(k.shape)} {k.dtype} "
                               f"({k.source}, read by {', '.join(k.read_by) or '-'}{versus})")
    if c.caches:
        table.add_row("  context", ctx + (f" from {c.context_length_source}" if c.context_length_source else ""))
    if c.longrope is not None:
        lr = c.longrope
        how = f"offset {lr.concat_offset} (genai_config)" if lr.kind == "concat" else lr.switch
        rows = f"short {lr.short_rows} rows, long {lr.long_rows} rows, " if lr.short_rows is not None else ""
        table.add_row("LongRoPE", f"{lr.kind}: {rows}original {lr.original_max_position}; {how}")
    if not c.positions:
        table.add_row("positions", "no position input")
    for p in c.positions:
        tiled = f", tiled to 3 axes in-graph ({p.tile_node})" if p.tiled_to_3d else ""
        table.add_row("positions", f"{p.name} {_fmt_shape(p.shape)} {p.layout}{tiled}")
    counts = ", ".join(f"{op} {n}" for op, n in c.dynamic_counts.items())
    table.add_row("dynamic", counts)
    for op, nodes in c.dynamic_nodes.items():
        # one row per distinct target set, so a 40-layer graph stays as short as a 2-layer one
        by_feeds: dict[tuple[str, ...], list[DynamicNode]] = {}
        for n in nodes:
            by_feeds.setdefault(tuple(n.feeds), []).append(n)
        for feeds, group in by_feeds.items():
            first = group[0]
            more = f" and {len(group) - 1} more" if len(group) > 1 else ""
            table.add_row(f"  {op} ×{len(group)}", f"→ {', '.join(feeds) or '-'}: "
                                                  f"{first.name}({', '.join(i for i in first.inputs if i)}){more}")
    table.add_row("inputs", _inputs_line(c.inputs))
    for note in c.notes:
        table.add_row("note", note)
    for v in verdicts or ():
        mark = _installed_mark(v)
        fix = f" — optimize runs {', '.join(v['downlevel'])} for it" if v["downlevel"] else ""
        table.add_row("runtime", f"{v['label']}{mark}: {_short_verdict(v['verdict'])}{fix}")
    if verdicts:
        table.add_row("", "predicted: from each runtime's probed table (static placement, capture on), not a session; "
                          "check --graph-capture runs one")
    console.print(table)


def _installed_mark(v: dict[str, Any]) -> str:
    """`` (installed)``, `` (installed: onnxruntime-webgpu 1.27.1)`` where its versions are not the probed table's,
    or `` (not installed)``; then ``predicted:``: the verdict is the probed table's prediction, not a session."""
    label = v.get("installed_label")
    if not v["installed"]:
        state = "not installed"
    elif label and not all(part in v["label"] for part in label.split(" + ")):
        state = f"installed: {label}"
    else:
        state = "installed"
    return f" ({state}), predicted"


def _short_verdict(text: str) -> str:
    """onnxruntime's load errors are long: the part that says why."""
    text = text.replace("This is an invalid model. ", "").replace("Fatal error: ", "")
    return text if len(text) <= 160 else text[:157] + "..."
