"""The values ``total-seq-on-gpu`` reads, written in other node forms (issue 32, "Match values, not forms").

:func:`mask_chain` replaces the builder's two length chains of an onnxruntime-genai decoder (``seqlens_k`` and
``total_sequence_length`` from ``attention_mask``) by one ``total`` form and one ``seqlens`` form from
:data:`TOTAL_FORMS` / :data:`SEQLENS_FORMS`, written as the default-domain opset ``opset`` spells its nodes
(``Squeeze``/``Unsqueeze``/``ReduceSum``/``Split`` axes as attributes below 13 and inputs from 13 on, ``Split`` with
``num_outputs`` from 18, ``Shape`` ``start``/``end`` from 15), and sets the model's import to ``opset``; with
``function=True`` both chains go into one model-local function (its own import of ``opset``, and of nothing else:
onnxruntime inlines functions at the model's opset, so the two agree).

Each form says the opsets where it exists and whether its values are the builder's (``same``: the pass must rewrite
it) or a lookalike that computes something else (a refusal naming the node that breaks the proof is the only right
answer). :func:`mutants` turns a selection into :class:`~mutants.Mutant` entries judged by the mutation suite against
an independent onnxruntime CPU run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from .edit import graph_input

SUB = "/model/attn_mask_reformat/attn_mask_subgraph"
I64, I32 = ir.DataType.INT64, ir.DataType.INT32


class Writer:
    """Nodes of one form, written at ``opset`` (constants as Constant nodes: a function holds no initializers);
    ``ref_axes``: a ReduceSum over axis 1 takes its axes from the function call's attribute ``axes``
    (``Constant(value_ints=@axes)``, a reference attribute), from opset 13 on."""

    def __init__(self, opset: int, prefix: str, ref_axes: bool = False) -> None:
        self.opset = opset
        self.prefix = prefix
        self.ref_axes = ref_axes
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, *inputs: ir.Value | None, outputs: int = 1, **attributes) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attributes or None, name=f"{self.prefix}/{op_type}_"
                       f"{len(self.nodes)}", num_outputs=outputs)
        for k, out in enumerate(node.outputs):
            out.name = f"{node.name}/output_{k}"
        self.nodes.append(node)
        return node.outputs[0] if outputs == 1 else node.outputs  # type: ignore[return-value]

    def const(self, array, dtype=np.int64) -> ir.Value:
        arr = np.asarray(array, dtype=dtype)
        return self.op("Constant", value=ir.tensor(arr))

    # -- the forms of one op across opsets -------------------------------------------------------------------
    def axes_op(self, op_type: str, x: ir.Value, axes: list[int], **attributes) -> ir.Value:
        """Squeeze / Unsqueeze / ReduceSum with ``axes``: an attribute below 13 (ReduceSum: below 13), an input
        after."""
        if self.opset < 13:
            return self.op(op_type, x, axes=axes, **attributes)
        if self.ref_axes and op_type == "ReduceSum" and axes == [1]:
            node = ir.Node("", "Constant", [], [ir.RefAttr("value_ints", "axes", ir.AttributeType.INTS)],
                           name=f"{self.prefix}/Constant_axes_{len(self.nodes)}")
            node.outputs[0].name = f"{node.name}/output_0"
            self.nodes.append(node)
            return self.op(op_type, x, node.outputs[0], **attributes)
        return self.op(op_type, x, self.const(axes), **attributes)

    def split2(self, x: ir.Value) -> list[ir.Value]:
        """Split of a 2-element vector into two 1-element ones: ``split`` attribute (< 13), input (13..17),
        ``num_outputs`` (>= 18)."""
        if self.opset < 13:
            return self.op("Split", x, outputs=2, axis=0, split=[1, 1])  # type: ignore[return-value]
        if self.opset < 18:
            return self.op("Split", x, self.const([1, 1]), outputs=2, axis=0)  # type: ignore[return-value]
        return self.op("Split", x, outputs=2, axis=0, num_outputs=2)  # type: ignore[return-value]

    def pad(self, x: ir.Value, after: int, value: int) -> ir.Value:
        """``after`` columns of ``value`` appended to a [batch, total] int64 tensor (Pad's inputs form, 11+)."""
        return self.op("Pad", x, self.const([0, 0, 0, after]), self.const(value), mode="constant")


@dataclasses.dataclass(frozen=True)
class Form:
    name: str
    build: Callable[[Writer, ir.Value], ir.Value]
    same: bool = True  # the builder's value (else a lookalike)
    since: int = 11
    why: str = ""

    def exists(self, opset: int) -> bool:
        return opset >= self.since


def _width(w: Writer, shape: ir.Value) -> ir.Value:
    return w.op("Cast", w.op("Gather", shape, w.const(1), axis=0), to=I32)


TOTAL_FORMS = {f.name: f for f in [
    Form("gather", lambda w, m: _width(w, w.op("Shape", m))),
    Form("gather-neg", lambda w, m: w.op("Cast", w.op("Gather", w.op("Shape", m), w.const(-1), axis=0), to=I32)),
    Form("shape-start-end", lambda w, m: w.op("Cast", w.axes_op("Squeeze", w.op("Shape", m, start=1, end=2), [0]),
                                                 to=I32), since=15),
    Form("shape-start-reshape", lambda w, m: w.op("Cast", w.op("Reshape", w.op("Shape", m, start=-1),
                                                                 w.const(np.zeros(0, np.int64))), to=I32), since=15),
    Form("slice-shape", lambda w, m: w.op("Cast", w.axes_op("Squeeze", w.op(
        "Slice", w.op("Shape", m), w.const([1]), w.const([2]), w.const([0])), [0]), to=I32)),
    Form("split-shape", lambda w, m: w.op("Cast", w.axes_op("Squeeze", w.split2(w.op("Shape", m))[1], [0]), to=I32)),
    Form("cast-chain", lambda w, m: w.op("Identity", w.op("Gather", w.op("Cast", w.op("Identity", w.op("Shape", m)),
                                                                          to=I32), w.const(1), axis=0))),
    Form("pad-zero-columns", lambda w, m: _width(w, w.op("Shape", w.pad(m, 0, 0)))),
    Form("pad-shape", lambda w, m: w.op("Cast", w.op("Gather", w.op("Pad", w.op("Shape", m), w.const([2, 0])),
                                                      w.const(3), axis=0), to=I32)),
    Form("gather-elements", lambda w, m: w.op("Cast", w.axes_op("Squeeze", w.op(
        "GatherElements", w.op("Shape", m), w.const([1]), axis=0), [0]), to=I32)),
    Form("castlike", lambda w, m: w.op("CastLike", w.op("Gather", w.op("Shape", m), w.const(1), axis=0),
                                       w.const(0, np.int32)), since=15),
    Form("reducemax-shape-slice", lambda w, m: w.op("Cast", w.op("ReduceMax", w.op("Shape", m, start=1, end=2),
                                                                 keepdims=0), to=I32), since=15),
    Form("row-sum-of-ones", lambda w, m: w.op("Cast", w.op("ReduceMax", w.axes_op("ReduceSum", w.op(
        "Add", w.op("Mul", m, w.const(0)), w.const(1)), [1], keepdims=0), keepdims=0), to=I32)),
    # lookalikes
    Form("largest-row-sum", lambda w, m: w.op("Cast", w.op("ReduceMax", w.axes_op("ReduceSum", m, [1], keepdims=0),
                                                           keepdims=0), to=I32), same=False,
         why="the largest row sum (the builder's _graph variant): below the width when no row is all ones"),
    Form("pad-shape-value", lambda w, m: w.op("Cast", w.op("Gather", w.op("Pad", w.op("Shape", m), w.const([0, 1]),
                                                                       w.const(40)), w.const(2), axis=0), to=I32),
         same=False, why="the shape padded with the number 40, its third entry read: 40, not the width"),
    Form("pad-one-column", lambda w, m: _width(w, w.op("Shape", w.pad(m, 1, 0))), same=False,
         why="the width of the mask padded by one column: one more than the mask's"),
    Form("float-roundtrip-plus-one", lambda w, m: w.op("Cast", w.op("Add", w.op("Cast", w.op(
        "Gather", w.op("Shape", m), w.const(1), axis=0), to=ir.DataType.FLOAT), w.const(1.0, np.float32)), to=I32),
         same=False, why="the width + 1, through float"),
    Form("size-div-batch", lambda w, m: w.op("Cast", w.op("Div", w.op("Size", m), w.op(
        "Gather", w.op("Shape", m), w.const(0), axis=0)), to=I32), same=False,
         why="Size(mask) / batch: the width for every batch but an empty one, which it divides by zero"),
]}


def _minus_one(w: Writer, sums: ir.Value) -> ir.Value:
    return w.op("Cast", w.op("Sub", sums, w.const(1)), to=I32)


def _where_self(w: Writer, sums: ir.Value) -> ir.Value:
    """``Where(s == s, s - 1, s)``: s - 1 for every row (an integer equals itself)."""
    return w.op("Cast", w.op("Where", w.op("Equal", sums, sums), w.op("Sub", sums, w.const(1)), sums), to=I32)


SEQLENS_FORMS = {f.name: f for f in [
    Form("builder", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", m, [1], keepdims=0))),
    Form("keepdims-squeeze", lambda w, m: _minus_one(w, w.axes_op("Squeeze", w.axes_op("ReduceSum", m, [1]), [1]))),
    Form("axes-neg-add", lambda w, m: w.op("Cast", w.op("Add", w.axes_op("ReduceSum", m, [-1], keepdims=0),
                                                        w.const(-1)), to=I32)),
    Form("int32-first", lambda w, m: w.op("Sub", w.axes_op("ReduceSum", w.op("Cast", m, to=I32), [1], keepdims=0),
                                          w.const(1, np.int32))),
    Form("identity-cast-chain", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.op("Cast", w.op(
        "Identity", m), to=I64), [1], keepdims=0))),
    Form("pad-zero-columns", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.pad(m, 2, 0), [1], keepdims=0))),
    Form("unsqueeze-reshape", lambda w, m: w.op("Cast", w.op("Reshape", w.op("Sub", w.axes_op(
        "Unsqueeze", w.axes_op("ReduceSum", m, [1], keepdims=0), [1]), w.const([[1]])), w.const([-1])), to=I32)),
    Form("castlike", lambda w, m: w.op("CastLike", w.op("Sub", w.axes_op("ReduceSum", m, [1], keepdims=0),
                                                        w.const(1)), w.const(0, np.int32)), since=15),
    Form("where-equal-self", lambda w, m: _where_self(w, w.axes_op("ReduceSum", m, [1], keepdims=0))),
    # lookalikes
    Form("pad-one-column", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.pad(m, 1, 1), [1], keepdims=0)),
         same=False, why="a column of ones appended: every row's sum + 1"),
    Form("sum-all-axes", lambda w, m: w.op("Cast", w.op("Expand", w.op("Sub", w.axes_op(
        "ReduceSum", m, [0, 1], keepdims=0), w.const(1)), w.op("Shape", m, start=0, end=1) if w.opset >= 15 else
        w.op("Slice", w.op("Shape", m), w.const([0]), w.const([1]))), to=I32), same=False,
         why="the sum of the whole mask (every row), repeated per row"),
    Form("int8-cast", lambda w, m: _minus_one(w, w.axes_op("ReduceSum", w.op("Cast", w.op(
        "Cast", m, to=ir.DataType.INT8), to=I64), [1], keepdims=0)), same=False,
         why="the mask through int8: a mask value of 300 becomes 44"),
    Form("float-sum", lambda w, m: w.op("Cast", w.op("Sub", w.axes_op("ReduceSum", w.op(
        "Cast", m, to=ir.DataType.FLOAT), [1], keepdims=0), w.const(1.0, np.float32)), to=I32), same=False,
         why="the row sums in float32: inexact past 2^24"),
    Form("twice-halved", lambda w, m: w.op("Cast", w.op("Div", w.op("Sub", w.axes_op("ReduceSum", w.op(
        "Mul", m, w.const(2)), [1], keepdims=0), w.const(1)), w.const(2)), to=I32), same=False,
         why="(2s - 1) / 2: s - 1 for every row but a row of zeros, where integer Div gives 0, not -1"),
]}


def _total(name: str) -> Form:
    """A total form of this module's or of :mod:`mutants.value_forms`'s (which builds on this one)."""
    from .value_forms import VALUE_TOTAL_FORMS

    return {**TOTAL_FORMS, **VALUE_TOTAL_FORMS}[name]


def _seqlens(name: str) -> Form:
    from .value_forms import VALUE_SEQLENS_FORMS

    return {**SEQLENS_FORMS, **VALUE_SEQLENS_FORMS}[name]


def mask_chain(total: str, seqlens: str, opset: int, function: bool = False, *, axes_attribute: bool = False,
               outputs: bool = False, per_layer: bool = False, width_in_function: bool = False):
    """An edit: the builder's two chains replaced by ``total``/``seqlens`` forms written at ``opset`` (in a
    model-local function importing ``opset`` when ``function``; else the model's import becomes ``opset``).

    Where the graph reads the int64 width elsewhere (phi3's LongRoPE switch), it reads ``Cast<int64>(total)``, or
    with ``width_in_function`` a third output of the function (the switch's condition then reads a value computed
    inside the function, which only its value proves the total). ``axes_attribute``: the function's
    ReduceSum axes come from the call's attribute (a reference attribute, opset 13+). ``outputs``: both lengths are
    also graph outputs (the caller reads them: they must keep their values). ``per_layer``: every
    GroupQueryAttention gets its own copy of the chains (one value, several chains)."""
    def edit(work: Work) -> list[str]:
        graph = work.graph
        gqas = [n for n in graph if n.op_type == "GroupQueryAttention"]
        mask = graph_input(graph, "attention_mask")
        old = [n for n in graph if (n.name or "").startswith(f"{SUB}/")]
        width = next(n for n in old if n.name == f"{SUB}/Gather").outputs[0]
        others = [(u, i) for u, i in width.uses() if u not in old]  # phi3's LongRoPE switch reads the int64 width
        work.model.opset_imports[""] = opset  # onnxruntime inlines a function at the model's opset: the same
        wide = None
        lengths = []
        for k in range(len(gqas) if per_layer else 1):
            prefix = f"/lengths{k if k else ''}"
            if function:
                param = ir.Value(name="mask", type=ir.TensorType(I64), shape=ir.Shape(["batch", "total"]))
                w = Writer(opset, prefix, ref_axes=axes_attribute)
                outs = [_total(total).build(w, param), _seqlens(seqlens).build(w, param)]
                if others and width_in_function:
                    outs.append(w.op("Gather", w.op("Shape", param), w.const(1), axis=0))
                key = ("custom.lengths", "MaskLengths", "")
                if key not in work.model.functions:
                    body = ir.Graph([param], outs, nodes=w.nodes, opset_imports={"": opset}, name="MaskLengths")
                    attrs = [ir.Attr("axes", ir.AttributeType.INTS, None)] if axes_attribute else []
                    work.model.functions[key] = ir.Function("custom.lengths", "MaskLengths", graph=body,
                                                            attributes=attrs)
                    work.model.opset_imports["custom.lengths"] = 1
                call = ir.node("MaskLengths", [mask], domain="custom.lengths", name=f"{prefix}/MaskLengths",
                               num_outputs=len(outs), attributes={"axes": [1]} if axes_attribute else None)
                for out, name in zip(call.outputs, ("total", "seqlens", "width"), strict=False):
                    out.name, out.dtype = f"{prefix}/{name}", I32 if name != "width" else I64
                nodes, (new_total, new_seqlens) = [call], call.outputs[:2]
                wide = wide or (call.outputs[2] if others and width_in_function else None)
            else:
                w = Writer(opset, prefix)
                new_total, new_seqlens = _total(total).build(w, mask), _seqlens(seqlens).build(w, mask)
                nodes = w.nodes
            graph.insert_before(gqas[0], nodes)
            lengths.append((new_total, new_seqlens))
        for k, gqa in enumerate(gqas):
            new_total, new_seqlens = lengths[k if per_layer else 0]
            gqa.replace_input_with(5, new_seqlens)
            gqa.replace_input_with(6, new_total)
        if others:
            if wide is None:
                w = Writer(opset, "/lengths/int64")
                wide = w.op("Cast", lengths[0][0], to=I64)
                graph.insert_before(others[0][0], w.nodes)
            for user, index in others:
                user.replace_input_with(index, wide)
        if outputs:
            graph.outputs.extend(lengths[0])
        for node in reversed(old):
            graph.remove(node, safe=True)
        graph.sort()
        return [n.name for n in gqas] + [lengths[0][0].name]
    return edit


#: ops whose axes (split) an input gives from this opset on, an attribute before
_AXES_INPUT_SINCE = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "Split": 13, "ReduceMax": 18, "ReduceMin": 18,
                     "ReduceMean": 18, "ReduceProd": 18}


def whole_graph_at(opset: int, edit):
    """An edit: ``edit``, then every other node of the main graph written as ``opset`` spells it (axes / split from a
    constant input moved to the attribute where ``opset`` takes one): the whole model at that opset."""
    def whole(work: Work) -> list[str]:
        touched = edit(work)
        for node in list(work.graph):
            since = _AXES_INPUT_SINCE.get(node.op_type)
            if node.domain not in ("", "ai.onnx") or since is None or opset >= since or len(node.inputs) < 2 \
                    or node.inputs[1] is None:
                continue
            given = node.inputs[1]
            tensor = given.const_value or given.producer().attributes["value"].value
            key = "split" if node.op_type == "Split" else "axes"
            node.attributes[key] = ir.AttrInt64s(key, [int(a) for a in np.asarray(tensor.numpy()).reshape(-1)])
            node.replace_input_with(1, None)
            node.resize_inputs(1)
        return touched
    return whole


def attention_in_function(total: str, seqlens: str, opset: int):
    """An edit: every GroupQueryAttention moves into one model-local function ``Attention(qkv, mask, past_key,
    past_value, cos, sin)`` (importing ``opset``, as the model does), whose body computes the lengths from its
    ``mask`` parameter in the ``total``/``seqlens`` forms: the pass must rewrite inside the body, at its opset."""
    def edit(work: Work) -> list[str]:
        graph = work.graph
        work.model.opset_imports[""] = opset
        gqas = [n for n in graph if n.op_type == "GroupQueryAttention"]
        mask = graph_input(graph, "attention_mask")
        old = [n for n in graph if (n.name or "").startswith(f"{SUB}/")]
        first = gqas[0]
        params = [ir.Value(name=n, type=ir.TensorType(t), shape=None) for n, t in (
            ("qkv", ir.DataType.FLOAT), ("mask", I64), ("past_key", ir.DataType.FLOAT),
            ("past_value", ir.DataType.FLOAT), ("cos", ir.DataType.FLOAT), ("sin", ir.DataType.FLOAT))]
        w = Writer(opset, "/attention")
        lengths = [_seqlens(seqlens).build(w, params[1]), _total(total).build(w, params[1])]
        body_gqa = ir.node("GroupQueryAttention", [params[0], None, None, params[2], params[3], *lengths, params[4],
                                                   params[5]], attributes=dict(first.attributes),
                           domain=first.domain, name="/attention/GroupQueryAttention", num_outputs=3)
        for k, out in enumerate(body_gqa.outputs):
            out.name = f"/attention/output_{k}"
        body = ir.Graph(params, list(body_gqa.outputs), nodes=[*w.nodes, body_gqa],
                        opset_imports={"": opset, first.domain: 1}, name="Attention")
        work.model.functions[("custom.attention", "Attention", "")] = ir.Function(
            "custom.attention", "Attention", graph=body, attributes=[])
        work.model.opset_imports["custom.attention"] = 1
        calls = []
        for gqa in gqas:
            ins = gqa.inputs
            call = ir.node("Attention", [ins[0], mask, ins[3], ins[4], ins[7], ins[8]], domain="custom.attention",
                           name=f"{gqa.name}/call", num_outputs=3)
            graph.insert_before(gqa, call)
            for old_out, new_out in zip(gqa.outputs, call.outputs, strict=True):
                new_out.name, new_out.dtype, new_out.shape = old_out.name + "/call", old_out.dtype, old_out.shape
                old_out.replace_all_uses_with(new_out, replace_graph_outputs=True)
                name = old_out.name
                old_out.name = name + "/old"
                new_out.name = name
            graph.remove(gqa, safe=True)
            calls.append(call.name)
        for node in reversed(old):
            graph.remove(node, safe=True)
        graph.sort()
        return calls
    return edit


BASE = "genai/current/llama/cpu_fp32"


def mutants() -> list[Mutant]:
    """Class ``node-form``: every lookalike at the lowest opset where it exists and inside a model-local function
    (opset 23); four forms of the builder's values inside a function (the fuzzer, tests/test_form_fuzzer.py, tries
    every form at every opset)."""
    def m(name, expect, pair, opset, function, why):
        return Mutant(f"form-{name}", "node-form", "total-seq-on-gpu", BASE, expect, mask_chain(*pair, opset, function),
                      why, target="webgpu-graph", reference="ort")

    out = []
    for kind, forms in (("total", TOTAL_FORMS), ("seqlens", SEQLENS_FORMS)):
        for form in forms.values():
            pair = (form.name, "builder") if kind == "total" else ("gather", form.name)
            if not form.same:
                out.append(m(f"{kind}-{form.name}-op{form.since}", REFUSE, pair, form.since, False, form.why))
                out.append(m(f"{kind}-{form.name}-function", REFUSE, pair, 23, True, f"{form.why}, in a function"))
    for total, seqlens, opset in (("split-shape", "keepdims-squeeze", 11), ("shape-start-end", "pad-zero-columns", 15),
                                  ("split-shape", "unsqueeze-reshape", 18), ("cast-chain", "int32-first", 23)):
        out.append(m(f"function-{total}+{seqlens}-op{opset}", EQUIVALENT, (total, seqlens), opset, True,
                     f"total as {total}, seqlens_k as {seqlens}, in a model-local function at opset {opset}"))
    return out
