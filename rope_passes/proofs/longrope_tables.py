"""LongRoPE GroupQueryAttention caches read part by part (the evidence lint RP402/RP404 word,
:mod:`rope_passes.lint.rules_config`):
the builder's ``If(Greater(total, C))`` short/long tables, a ``[short; long]`` concatenation split at
``multiRotaryCacheConcatOffset`` (else at the original context), mobius-onnx's form; :func:`longrope_fault` compares
the short table on its first ``C`` rows and the long one on all with config.json's factors and names the cause.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.graph import const_tensor
from rope_passes.analysis.longrope import if_switch
from rope_passes.config import GenaiConfig
from rope_passes.hf_config import Rope
from rope_passes.report import name_of


@dataclasses.dataclass
class _Part:
    """One of LongRoPE's two tables as a GroupQueryAttention reads it: rows ``start..start+rows-1`` of ``value``
    hold positions ``0..rows-1`` of the config's short (``long=False``) or long table."""

    long: bool
    value: ir.Value
    table: np.ndarray
    start: int
    rows: int

    @property
    def label(self) -> str:
        return "long" if self.long else "short"


@dataclasses.dataclass
class _Fault:
    """The first LongRoPE part that differs from config.json (``position`` None: the form could not be read,
    ``cause`` says why; ``row`` None: every part conforms)."""

    rope: Rope
    role: str
    name: str
    what: str  # the form and the part, e.g. "long table, rows 32..287 of the [short 32; long 256] concatenation"
    position: int | None = None  # in the part's own table
    row: int | None = None  # in the graph's table
    worst: float = 0.0
    cause: str = ""
    label: str = ""  # short | long

    @property
    def part_words(self) -> str:
        """``long position 100 (row 132)``: the position in its own table, and the graph's row where it differs."""
        row = f" (row {self.row})" if self.row != self.position else ""
        return f"{self.label} position {self.position}{row}"


def _longrope_parts(model: ir.Model, genai_config: GenaiConfig, rope: Rope, cos: ir.Value, sin: ir.Value
                    ) -> tuple[str, dict[str, list[_Part]]] | None:
    """The short and long tables a GroupQueryAttention reads (per role), and the form in words: the builder's
    ``If(Greater(total, original))`` (then: long, else: short; the short one is compared on its first ``original``
    rows, transformers never reads it further), or one constant ``[short; long]`` concatenation split at
    genai_config's multiRotaryCacheConcatOffset or at ``original_max_position_embeddings`` (mobius writes no
    offset). None where neither form is there (a plain table: RP401/RP203's)."""
    orig = rope.original_max
    if not orig:
        return None
    switch = cos.producer()
    if switch is not None and switch.op_type == "If" and sin.producer() is switch:
        found = if_switch(model, switch)
        outs = list(switch.outputs)
        k = {role: next(i for i, o in enumerate(outs) if o is v) for role, v in (("cos", cos), ("sin", sin))}
        then_long = not found.long or found.long is found.then_tables  # the builder: then = total > original
        parts: dict[str, list[_Part]] = {}
        for role in ("cos", "sin"):
            tables = []
            for branch, is_long in ((found.else_tables, not then_long), (found.then_tables, then_long)):
                if k[role] >= len(branch):
                    return None
                value = branch[k[role]]
                tensor = const_tensor(value)
                if tensor is None or len(tensor.shape) != 2:
                    return None
                array = tensor.numpy()
                tables.append(_Part(is_long, value, array, 0, array.shape[0] if is_long else min(orig,
                                                                                                   array.shape[0])))
            parts[role] = sorted(tables, key=lambda p: p.long)
        return f"If {switch.name!r}", parts
    read = [const_tensor(v) for v in (cos, sin)]
    tensors = [t for t in read if t is not None and len(t.shape) == 2 and isinstance(t.shape[0], int)]
    if len(tensors) != 2:
        return None
    rows = tensors[0].shape[0]
    assert isinstance(rows, int)  # checked above
    configured = genai_config.concat_offset
    lengths = {n for n in (rope.max_position_embeddings, genai_config.context_length) if n}
    splits = [s for s in dict.fromkeys([configured, orig]) if s and 0 < s < rows]
    split = next((s for s in splits if rows - s in lengths), splits[0] if configured in splits else None)
    if split is None:
        return None
    parts = {role: [_Part(False, v, t.numpy(), 0, split), _Part(True, v, t.numpy(), split, rows - split)]
             for role, v, t in (("cos", cos, tensors[0]), ("sin", sin, tensors[1]))}
    return f"[short {split}; long {rows - split}] concatenation", parts


def _part_cause(rope: Rope, role: str, part: _Part, got: np.ndarray, first: int, worst: float) -> str:
    """Why a part differs: the other factors' table, another attention scaling, a few rows, or the frequencies."""
    if rope.first_beyond_rounding(role, got, not part.long)[0] is None:
        other = "short" if part.long else "long"
        return (f"it holds the {other} factors' table (LongRoPE frozen: calls "
                f"{'past' if part.long else 'up to'} {rope.original_max} tokens rotate with the wrong factors)")
    cos, sin = rope.tables(got.shape[0], part.long, layout="cache")
    want = (cos if role == "cos" else sin).astype(np.float64)
    scale = float(rope.attention_scaling)
    peak = np.abs(want).max()
    if peak > 0:
        ratio = float(np.abs(got.astype(np.float64)).max() / peak) * scale
        rescaled = dataclasses.replace(rope, params={**rope.params, "attention_factor": ratio})
        if abs(ratio - scale) > 1e-4 and rescaled.first_beyond_rounding(role, got, part.long)[0] is None:
            return (f"attention scaling differs: the graph multiplies cos/sin by {ratio:.6g}, config.json by "
                    f"{scale:.6g}")
    diff = np.abs(got.astype(np.float64) - want).max(axis=1)
    bad = np.flatnonzero(diff > rope.tolerance(got.shape[0], part.long, got.dtype).max(axis=1))
    if 0 < bad.size <= 4:
        return f"{bad.size} row(s) differ ({', '.join(f'position {int(b)}' for b in bad)}), the others conform"
    return f"the {part.label} factors' frequencies differ from config.json's"


def longrope_fault(model: ir.Model, genai_config: GenaiConfig, rope: Rope, cos: ir.Value, sin: ir.Value
                   ) -> _Fault | None:
    """The first place (short table first, cos before sin) where a GroupQueryAttention's LongRoPE tables differ from
    config.json's beyond float32 (float16) rounding (:meth:`Rope.first_beyond_rounding`): a ``_Fault`` with ``row``
    None when all conform; None when the tables are not in a LongRoPE form."""
    rope = dataclasses.replace(rope, table_interleaved=False)
    found = _longrope_parts(model, genai_config, rope, cos, sin)
    if found is None:
        return None
    form, parts = found
    for index in range(2):
        for role in ("cos", "sin"):
            part = parts[role][index]
            name = part.value.name or role
            span = (f"rows {part.start}..{part.start + part.rows - 1} of the {form}" if part.value is cos or
                    part.value is sin else f"{form}'s {'then' if part.long else 'else'} branch")
            what = f"{part.label} table, {span}"
            if part.table.shape[1] * 2 != rope.rotary_dim:
                return _Fault(rope, role, name, what, 0, part.start, math.inf,
                              f"it is {part.table.shape[1]} wide (rotary dim {2 * part.table.shape[1]}), "
                              f"config.json's rotary dim is {rope.rotary_dim}", part.label)
            got = part.table[part.start:part.start + part.rows]
            first, worst = rope.first_beyond_rounding(role, got, part.long)
            if first is not None:
                return _Fault(rope, role, name, what, first, part.start + first, worst,
                              _part_cause(rope, role, part, got, first, worst), part.label)
    return _Fault(rope, "cos", name_of(cos) or "cos", form)


__all__ = ["longrope_fault"]
