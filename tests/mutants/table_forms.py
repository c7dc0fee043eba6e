"""LongRoPE's short/long tables as constant *values* that are not plain float constants (issue 32).

The builder's ``If`` branches return ``Constant`` tables. :func:`tables_as` rewrites each branch output into one of
:data:`TABLE_FORMS`: int8 codes through a per-column ``DequantizeLinear`` with zero points, bf16 tables held by the
outer graph and cast inside the branch (through ``Identity``), an fp16 round trip inside the branch, a ``Slice`` of a
longer table, ``Identity`` chains. Each is a constant the one evaluator folds; ``longrope-concat`` must concatenate
the folded values exactly as onnxruntime computes them (the mutation suite and the fuzzer compare with its CPU run).
The lookalike (``same=False``) adds a number read from a graph input's shape: not a constant, refused naming the
node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, LONGROPE_CALLS, REFUSE, Mutant, Work
from .edit import graph_input

BASE = "genai/current/phi3_mini_128k/cpu_fp32"
F32 = ir.DataType.FLOAT


class _Branch:
    """New nodes of one If branch (constants as Constant nodes: a branch holds no initializers)."""

    def __init__(self, graph: ir.Graph, model_graph: ir.Graph, prefix: str) -> None:
        self.graph, self.main, self.prefix = graph, model_graph, prefix
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, *inputs: ir.Value, dtype: ir.DataType | None = None, **attributes) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attributes or None,
                       name=f"{self.prefix}/{op_type}_{len(self.nodes)}")
        node.outputs[0].name = f"{node.name}/output_0"
        if dtype is not None:
            node.outputs[0].dtype = dtype
        self.nodes.append(node)
        return node.outputs[0]

    def const(self, array: np.ndarray) -> ir.Value:
        return self.op("Constant", value=ir.tensor(np.ascontiguousarray(array)),
                       dtype=ir.DataType.from_numpy(array.dtype))

    def outer(self, name: str, tensor: ir.TensorProtocol) -> ir.Value:
        """An initializer of the main graph (read from the branch as an outer-scope value)."""
        value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
        self.main.register_initializer(value)
        return value


def _dequant(b: _Branch, table: np.ndarray) -> ir.Value:
    scale = (np.abs(table).max(axis=0) / 100 + 1e-3).astype(np.float32)
    zero = (np.arange(table.shape[1]) % 7 - 3).astype(np.int8)
    codes = np.clip(np.round(table / scale) + zero, -128, 127).astype(np.int8)
    return b.op("DequantizeLinear", b.const(codes), b.const(scale), b.const(zero), axis=1, dtype=F32)


def _bf16_outer(b: _Branch, table: np.ndarray) -> ir.Value:
    import ml_dtypes

    held = b.outer(f"{b.prefix}/bf16_table", ir.tensor(table.astype(ml_dtypes.bfloat16)))
    return b.op("Cast", b.op("Identity", held, dtype=ir.DataType.BFLOAT16), to=F32, dtype=F32)


def _fp16_roundtrip(b: _Branch, table: np.ndarray) -> ir.Value:
    half = b.op("Cast", b.const(table), to=ir.DataType.FLOAT16, dtype=ir.DataType.FLOAT16)
    return b.op("Cast", half, to=F32, dtype=F32)


def _slice(b: _Branch, table: np.ndarray) -> ir.Value:
    longer = np.concatenate([table, table[:5] * 2], axis=0)
    rows = np.array([0], np.int64), np.array([table.shape[0]], np.int64)
    return b.op("Slice", b.const(longer), b.const(rows[0]), b.const(rows[1]), b.const(np.array([0], np.int64)),
                dtype=F32)


def _identities(b: _Branch, table: np.ndarray) -> ir.Value:
    return b.op("Identity", b.op("Identity", b.const(table), dtype=F32), dtype=F32)


def _plus_batch(b: _Branch, table: np.ndarray) -> ir.Value:
    """table + (batch - batch) * 0 read from input_ids' shape: the same numbers, but read from the call."""
    ids = graph_input(b.main, "input_ids")
    batch = b.op("Cast", b.op("Shape", ids, start=0, end=1, dtype=ir.DataType.INT64), to=F32, dtype=F32)
    return b.op("Add", b.const(table), b.op("Mul", batch, b.const(np.zeros(1, np.float32)), dtype=F32), dtype=F32)


@dataclasses.dataclass(frozen=True)
class TableForm:
    name: str
    build: Callable[[_Branch, np.ndarray], ir.Value]
    same: bool = True  # a constant value (else a lookalike that reads the call)
    exact: bool = True  # the table's values are the builder's (else rounded: int8 codes, bf16)
    why: str = ""


TABLE_FORMS = {f.name: f for f in [
    TableForm("dequant-int8-per-column", _dequant, exact=False,
              why="int8 codes with a per-column scale and zero point through DequantizeLinear (axis 1)"),
    TableForm("bf16-outer-cast", _bf16_outer, exact=False,
              why="bf16 tables in the outer graph, Identity then Cast to float inside the branch"),
    TableForm("fp16-roundtrip", _fp16_roundtrip, exact=False,
              why="fp32 tables cast to fp16 and back inside the branch (rounded as onnxruntime rounds)"),
    TableForm("slice-of-longer", _slice, why="a Slice of a longer constant table"),
    TableForm("identity-chain", _identities, why="Identity(Identity(table))"),
    TableForm("plus-call-shape", _plus_batch, same=False,
              why="table + 0 * batch: the same numbers, but computed from input_ids' shape on every call"),
]}


def tables_as(form: str, only: str | None = None, opset: int | None = None):
    """An edit: every If branch output (``only``: of that branch) computed in ``form`` from its Constant's value;
    ``opset``: the model's default-domain import set to it (the phi3 graph's other nodes are the same there)."""
    def edit(work: Work) -> list[str]:
        if opset is not None:
            work.model.opset_imports[""] = opset
        (if_node,) = [n for n in work.graph if n.op_type == "If"]
        for key in ("then_branch", "else_branch"):
            if only is not None and key != only:
                continue
            branch = if_node.attributes[key].value
            for index, out in enumerate(list(branch.outputs)):
                constant = out.producer()
                table = constant.attributes["value"].value.numpy()
                b = _Branch(branch, work.graph, f"/form/{key}/{index}")
                new = TABLE_FORMS[form].build(b, table)
                new.shape = ir.Shape(table.shape)
                for node in b.nodes:
                    branch.append(node)
                branch.outputs[index] = new
                branch.remove(constant, safe=True)
        return [if_node.name]
    return edit


def switch_as(kind: str):
    """An edit: LongRoPE's ``If`` written another way. ``where``: ``Where(condition, large, small)`` over outer
    tables, the short one zero-padded to the long one's rows (no control flow: the same choice, row for row);
    ``where-per-row`` (a lookalike): the condition also compares each row index with 8, so a long call mixes the
    two tables row by row; ``function``: the condition and the If inside a model-local function
    ``LongRopeTables(width)`` importing the model's opset (onnxruntime inlines it: the same values);
    ``not-swapped``: ``If(Not(total > 32))`` with the branches swapped (then: the short table; the same choice);
    ``not`` (a lookalike): ``If(Not(total > 32))`` with the builder's branches (the long table for short totals);
    ``swapped`` (a lookalike): ``If(total > 32)`` with the branches swapped (the short table for long totals);
    ``where-not``: ``Where(Not(total > 32), short, long)`` (the same choice as ``where``); ``extra-output``: the If
    also returns an int64 scalar (a Constant in each branch) that nothing reads (the same tables)."""
    def edit(work: Work) -> list[str]:
        graph = work.graph
        (if_node,) = [n for n in graph if n.op_type == "If"]
        cond = if_node.inputs[0]
        if kind == "extra-output":
            for key, number in (("then_branch", 1), ("else_branch", 0)):
                body = if_node.attributes[key].value
                extra = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(number, np.int64))},
                                name=f"/switch/{key}/extra")
                extra.outputs[0].name = f"/switch/{key}/extra_output"
                extra.outputs[0].dtype, extra.outputs[0].shape = ir.DataType.INT64, ir.Shape([])
                body.append(extra)
                body.outputs.append(extra.outputs[0])
            wider = ir.node("If", [cond], attributes=dict(if_node.attributes), name=if_node.name,
                            num_outputs=len(if_node.outputs) + 1)
            graph.insert_before(if_node, wider)
            for old, new in zip(if_node.outputs, wider.outputs):
                new.dtype, new.shape = old.dtype, old.shape
                old.replace_all_uses_with(new)
                name = old.name
                old.name = f"{name}/old"
                new.name = name
            wider.outputs[-1].name, wider.outputs[-1].dtype = "/switch/extra", ir.DataType.INT64
            graph.remove(if_node, safe=True)
            return [wider.name]
        if kind == "function":
            greater = cond.producer()
            opset = work.model.opset_imports[""]
            width = ir.Value(name="width", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
            threshold = ir.node("Constant", [], attributes={"value": greater.inputs[1].const_value
                                                             or greater.inputs[1].producer().attributes["value"].value},
                                name="/switch/threshold")
            inner_cond = ir.node("Greater", [width, threshold.outputs[0]], name="/switch/Greater")
            inner_if = ir.node("If", [inner_cond.outputs[0]], attributes=dict(if_node.attributes), name="/switch/If",
                               num_outputs=len(if_node.outputs))
            for k, out in enumerate(inner_if.outputs):
                out.name = f"/switch/table_{k}"
            body = ir.Graph([width], list(inner_if.outputs), nodes=[threshold, inner_cond, inner_if],
                            opset_imports={"": opset}, name="LongRopeTables")
            work.model.functions[("custom.switch", "LongRopeTables", "")] = ir.Function(
                "custom.switch", "LongRopeTables", graph=body, attributes=[])
            work.model.opset_imports["custom.switch"] = 1
            call = ir.node("LongRopeTables", [greater.inputs[0]], domain="custom.switch", name="/switch/call",
                           num_outputs=len(if_node.outputs))
            graph.insert_before(if_node, call)
            for old, new in zip(if_node.outputs, call.outputs, strict=True):
                new.dtype, new.shape = old.dtype, old.shape
                old.replace_all_uses_with(new)
                name = old.name
                old.name = f"{name}/old"
                new.name = name
            graph.remove(if_node, safe=True)
            if not cond.uses():
                graph.remove(greater, safe=True)
            graph.sort()
            return [call.name]
        if kind in ("not-swapped", "not", "swapped"):
            if kind != "swapped":
                negated = ir.node("Not", [cond], name="/switch/Not")
                graph.insert_before(if_node, negated)
                if_node.replace_input_with(0, negated.outputs[0])
            if kind != "not":
                branches = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
                if_node.attributes["then_branch"] = ir.AttrGraph("then_branch", branches[1])
                if_node.attributes["else_branch"] = ir.AttrGraph("else_branch", branches[0])
            return [if_node.name]
        tables = [[out.producer().attributes["value"].value.numpy() for out in if_node.attributes[key].value.outputs]
                  for key in ("then_branch", "else_branch")]
        w_nodes = []
        if kind == "where-not":  # Where(Not(total > 32), short, long): the same choice
            negated = ir.node("Not", [cond], name="/switch/Not")
            w_nodes, cond = [negated], negated.outputs[0]
        if kind == "where-per-row":
            rows = np.arange(tables[0][0].shape[0], dtype=np.int64).reshape(-1, 1)
            index = ir.node("Constant", [], attributes={"value": ir.tensor(rows)}, name="/switch/row_index")
            eight = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(8, np.int64))}, name="/switch/eight")
            low = ir.node("Less", [index.outputs[0], eight.outputs[0]], name="/switch/Less")
            both = ir.node("And", [cond, low.outputs[0]], name="/switch/And")
            w_nodes = [index, eight, low, both]
            cond = both.outputs[0]
        wheres = []
        for k, (large, small) in enumerate(zip(*tables, strict=True)):
            padded = np.zeros_like(large)
            padded[: small.shape[0]] = small
            values = []
            for label, table in (("large", large), ("small", padded)):
                v = ir.Value(name=f"/switch/{label}_{k}", shape=ir.Shape(table.shape),
                             type=ir.TensorType(ir.DataType.from_numpy(table.dtype)), const_value=ir.tensor(table))
                graph.register_initializer(v)
                values.append(v)
            where = ir.node("Where", [cond, *(values[::-1] if kind == "where-not" else values)],
                            name=f"/switch/Where_{k}")
            where.outputs[0].dtype, where.outputs[0].shape = if_node.outputs[k].dtype, ir.Shape(large.shape)
            wheres.append(where)
        graph.insert_before(if_node, w_nodes + wheres)
        for old, where in zip(if_node.outputs, wheres, strict=True):
            old.replace_all_uses_with(where.outputs[0])
            name = old.name
            old.name = f"{name}/old"
            where.outputs[0].name = name
        graph.remove(if_node, safe=True)
        graph.sort()
        return [w.name for w in wheres]
    return edit


def mutants() -> list[Mutant]:
    """Class ``node-form``: each table form in both branches, each lookalike in one; judged against the mutant on
    onnxruntime CPU with the concatenated cache's offset emulated."""
    out = []
    for form in TABLE_FORMS.values():
        out.append(Mutant(f"form-tables-{form.name}", "node-form", "longrope-concat", BASE,
                          EQUIVALENT if form.same else REFUSE, tables_as(form.name, None if form.same else "then_branch"),
                          form.why, target="webgpu-graph", reference="offset", calls=LONGROPE_CALLS))
    out.append(Mutant("form-tables-dequant-int8-per-column-op13", "node-form", "longrope-concat", BASE, EQUIVALENT,
                      tables_as("dequant-int8-per-column", opset=13), "DequantizeLinear-13 (per-axis since 13; onnx's "
                      "reference evaluator implements it from 19 on)", target="webgpu-graph", reference="offset",
                      calls=LONGROPE_CALLS))
    return out
