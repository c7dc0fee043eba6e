"""Mutants attacking ``annotate-cache-offset``: a concatenated ``[short; long]`` LongRoPE cache and its offset.

The builder's ``webgpu_fp16_graph`` Phi-3 graph carries one ``[32 + 256, 16]`` cos/sin cache and genai_config's
``multiRotaryCacheConcatOffset = 32``. The mutants change the offset in the config, or the table so that its real
split (known by construction: ``truth_offset``) is not what the row count and config suggest. Reference: the mutant's
graph run with its true offset vs the output's graph run with the offset the output's genai_config gives it
(WebGPU's offset emulated on CPU, see :mod:`.oracle`).

Session mutants (class ``session``): the offset is one value for the session, applied by WebGPU to every packed-QKV
GroupQueryAttention with do_rotary=1; layer 1 is given a plain table, or a second concatenation split at the same or
another row, and a genai_config.json carries an offset for graphs in which nothing reads a concatenated cache (truth
offset 0: the graph run as it is, no layer shifted). Refused where one offset cannot serve every layer; the stale
offset is removed (and the output run without it must equal the mutant run without it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, LONGROPE_CALLS, REFUSE, Mutant, Work
from .edit import nodes_of, replace_initializer
from .longrope import feed_tables, unpack_qkv

PASS = "annotate-cache-offset"
BASE = "genai/current/phi3_mini_128k/webgpu_fp16_graph"
KEY = "multiRotaryCacheConcatOffset"
ORIGINAL = 32


def _webgpu_options(config: dict) -> dict:
    for entry in config["model"]["decoder"]["session_options"]["provider_options"]:
        if "webgpu" in entry:
            return entry["webgpu"]
    raise AssertionError("no webgpu provider options")


def set_offset(value: str | None):
    def edit(work: Work) -> list[str]:
        options = _webgpu_options(work.config)
        if value is None:
            options.pop(KEY, None)
        else:
            options[KEY] = value
        return ["cos_cache"]
    return edit


def _tables(work: Work) -> tuple[np.ndarray, np.ndarray]:
    g = work.graph
    return g.initializers["cos_cache"].const_value.numpy().copy(), g.initializers["sin_cache"].const_value.numpy().copy()


def _rope(cos: np.ndarray, sin: np.ndarray, first: int, rows: int, factor: float = 1.0) -> tuple[np.ndarray, ...]:
    """``rows`` rows of the RoPE whose position-0 row is ``first`` (scale) and position-1 row gives the frequencies."""
    c0, c1, s1 = (a.astype(np.float64) for a in (cos[first], cos[first + 1], sin[first + 1]))
    w = np.arctan2(s1, c1) * factor
    p = np.arange(rows, dtype=np.float64)[:, None]
    return (c0 * np.cos(p * w)).astype(cos.dtype), (c0 * np.sin(p * w)).astype(sin.dtype)


def tables(build, offset: str | None = None):
    """Both caches replaced by ``build(cos, sin) -> (cos, sin)``; the config's offset set to ``offset`` (None: removed)."""
    def edit(work: Work) -> list[str]:
        cos, sin = build(*_tables(work))
        replace_initializer(work.graph, "cos_cache", cos)
        replace_initializer(work.graph, "sin_cache", sin)
        return set_offset(offset)(work)
    return edit


def truncated(cos, sin):
    return cos[:280], sin[:280]


def short_everywhere(cos, sin):
    """Rows 32.. continue the *short* RoPE: both halves have the same factors."""
    lc, ls = _rope(cos, sin, 0, 256)
    return np.concatenate([cos[:ORIGINAL], lc]), np.concatenate([sin[:ORIGINAL], ls])


def split_at_24(cos, sin):
    """[short[:24]; long[:256]; long[248:256]]: 288 rows, but the long half starts at row 24."""
    return (np.concatenate([cos[:24], cos[ORIGINAL:], cos[-8:]]), np.concatenate([sin[:24], sin[ORIGINAL:], sin[-8:]]))


def long_refactored(cos, sin):
    """The long half rebuilt with 0.9x its frequencies: still a [short; long] pair split at 32."""
    lc, ls = _rope(cos, sin, ORIGINAL, 256, factor=0.9)
    return np.concatenate([cos[:ORIGINAL], lc]), np.concatenate([sin[:ORIGINAL], ls])


def long_shifted_by_one(cos, sin):
    """[short; long RoPE of positions 1..256]: 288 rows that look like the pair, but row 32 + p holds position p + 1
    (position arithmetic hidden in the table): no offset makes GroupQueryAttention read position p's row."""
    lc, ls = _rope(cos, sin, ORIGINAL, 257)
    return np.concatenate([cos[:ORIGINAL], lc[1:]]), np.concatenate([sin[:ORIGINAL], ls[1:]])


def context_length(value: int):
    def edit(work: Work) -> list[str]:
        work.config["model"]["context_length"] = value
        return set_offset(None)(work)
    return edit


# ------------------------------------------------------------------------------------------------------------
# Session: one offset, every layer
# ------------------------------------------------------------------------------------------------------------
LLAMA = "genai/current/llama/webgpu_fp16"
PHI3_IF = "genai/current/phi3_mini_128k/cpu_fp32"


def _layer(work: Work, k: int):
    return nodes_of(work.graph, "GroupQueryAttention")[k]


def layer_reads(k: int, build, offset: str | None = None, separate: bool = False):
    """Layer ``k`` reads its own tables ``build(cos, sin)`` (from the concatenated ones); the config's offset set to
    ``offset`` (None: removed); through separate Q/K/V with ``separate``."""
    def edit(work: Work) -> list[str]:
        cos, sin = build(*_tables(work))
        feed_tables(work, _layer(work, k), cos, sin, f"layer{k}_tables")
        if separate:
            unpack_qkv(work, _layer(work, k))
        return set_offset(offset)(work)
    return edit


def plain_long(cos, sin):
    """The long half alone: a plain 256-row RoPE table (context_length rows)."""
    return cos[ORIGINAL:], sin[ORIGINAL:]


def plain_full_rows(cos, sin):
    """One RoPE table (the short factors) over all 288 rows: the row count of a concatenation, plain RoPE inside."""
    return _rope(cos, sin, 0, cos.shape[0])


def add_offset(value: str):
    """A genai_config.json offset for a graph that has no concatenated cache."""
    def edit(work: Work) -> list[str]:
        session = work.config["model"]["decoder"].setdefault("session_options", {})
        providers = session.setdefault("provider_options", [])
        entry = next((e for e in providers if "webgpu" in e), None)
        if entry is None:
            entry = {"webgpu": {}}
            providers.append(entry)
        entry["webgpu"][KEY] = value
        return ["cos_cache"]
    return edit


def if_not_a_switch_with_offset(work: Work) -> list[str]:
    """The LongRoPE If made a switch longrope-concat refuses (Less(total, 32): long for short contexts), and an
    offset in genai_config.json: no layer reads a concatenated cache."""
    (if_node,) = nodes_of(work.graph, "If")
    greater = if_node.inputs[0].producer()
    less = ir.node("Less", list(greater.inputs), name="/mutant/switch/Less")
    less.outputs[0].name, less.outputs[0].dtype = "/mutant/switch/Less/output_0", ir.DataType.BOOL
    work.graph.insert_before(greater, less)
    greater.outputs[0].replace_all_uses_with(less.outputs[0])
    work.graph.remove(greater, safe=True)
    add_offset("32")(work)
    return [if_node.name]


def caches_are_inputs(work: Work) -> list[str]:
    """cos/sin_cache also graph inputs (an exporter's keep_initializers_as_inputs): the caller may feed any table."""
    for name in ("cos_cache", "sin_cache"):
        work.graph.inputs.append(work.graph.initializers[name])
    return ["cos_cache"]


def mutants() -> list[Mutant]:
    def m(name, expect, edit, why, truth):
        return Mutant(f"annotate-{name}", "cache-offset", PASS, BASE, expect, edit, why, target="webgpu-graph",
                      reference="offset-truth", calls=LONGROPE_CALLS, truth_offset=truth, fp16=True)

    return [
        m("offset-wrong-16", EQUIVALENT, set_offset("16"), "the config says 16, the table splits at 32", 32),
        m("offset-missing", EQUIVALENT, set_offset(None), "no offset in the config, the table splits at 32", 32),
        m("long-refactored", EQUIVALENT, tables(long_refactored), "another valid long half (0.9x), no offset", 32),
        m("rows-truncated", REFUSE, tables(truncated), "280 rows: not original + context_length, no offset", 32),
        m("short-equals-long", REFUSE, tables(short_everywhere),
          "rows 32.. continue the short RoPE: not a LongRoPE pair (an offset of 32 would still be needed)", 32),
        m("split-at-24", REFUSE, tables(split_at_24),
          "288 rows, but the long half starts at row 24: offset 32 (rows - context) is wrong", 24),
        m("long-shifted-by-one", REFUSE, tables(long_shifted_by_one),
          "the long half starts at position 1, not 0: rows 32.. are no long table from position 0", 32),
        m("context-length-128", REFUSE, context_length(128),
          "genai_config context_length 128: rows - context = 160 is not the split", 32),
    ] + session_mutants()


def session_mutants() -> list[Mutant]:
    def m(name, expect, edit, why, truth, base=BASE, fp16=True):
        return Mutant(f"annotate-{name}", "session", PASS, base, expect, edit, why, target="webgpu-graph",
                      reference="offset-truth", calls=LONGROPE_CALLS, truth_offset=truth, fp16=fp16)

    return [
        m("layer1-plain", REFUSE, layer_reads(1, plain_long),
          "layer 1 reads a plain 256-row table, layer 0 the [32; 256] concatenation: offset 32 (which layer 0 needs) "
          "shifts layer 1 past 32 tokens", 32),
        m("layer0-plain", REFUSE, layer_reads(0, plain_long),
          "layer 0 plain, layer 1 concatenated: the first reader is plain, the offset is still wrong for it", 32),
        m("layer1-plain-offset-kept", REFUSE, layer_reads(1, plain_long, offset="32"),
          "the builder's offset 32 kept while layer 1 reads a plain table: no offset serves both layers; nothing to "
          "write (lint RP209)", 32),
        m("layer1-separate-qkv-plain", EQUIVALENT, layer_reads(1, plain_long, separate=True),
          "layer 1 reads a plain table through separate Q/K/V: WebGPU does not apply the offset there; offset 32 is "
          "right for layer 0 and leaves layer 1 alone", 32),
        m("layer1-other-concat-same-split", EQUIVALENT, layer_reads(1, long_refactored),
          "layer 1 reads another [32; 256] concatenation (long half 0.9x): one offset 32 serves both", 32),
        m("layer1-concat-split-at-24", REFUSE, layer_reads(1, lambda c, s: (np.concatenate([c[:24], c[ORIGINAL:]]),
                                                                            np.concatenate([s[:24], s[ORIGINAL:]]))),
          "layer 1 reads [short[:24]; long] (280 rows), layer 0 [short[:32]; long]: splits 24 and 32", 32),
        m("offset-on-plain-tables", EQUIVALENT, tables(plain_long, offset="32"),
          "both layers read a plain 256-row table and genai_config carries offset 32: it must go (no layer can "
          "honour it; the graph run without an offset is the truth)", 0),
        m("offset-on-plain-288-rows", EQUIVALENT, tables(plain_full_rows, offset="32"),
          "288 rows (32 + context 256), but one RoPE table from row 0: plain, offset 32 must go", 0),
        m("same-factors-offset-kept", REFUSE, tables(short_everywhere, offset="32"),
          "[short[:32]; short RoPE restarted at 0]: the halves share factors (not LongRoPE) but the table needs offset "
          "32 as it is; it must not be removed as if plain", 32),
        m("caches-are-inputs-offset-kept", REFUSE, caches_are_inputs,
          "cos/sin_cache are initializers the caller may override (graph inputs) and offset 32 is configured: the "
          "default is the builder's concatenation, so the offset must not be removed as stale", 32),
        m("offset-on-llama", EQUIVALENT, add_offset("32"),
          "plain RoPE (llama) with offset 32 in genai_config: it must go", 0, base=LLAMA),
        m("offset-on-if-switch", EQUIVALENT, if_not_a_switch_with_offset,
          "a LongRoPE If that longrope-concat refuses (Less) and offset 32 in genai_config: no concatenated cache, "
          "the offset must go", 0, base=PHI3_IF, fp16=False),
    ]
