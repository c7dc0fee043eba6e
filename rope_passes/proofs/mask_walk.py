"""One abstract evaluation of a length value's cone for :mod:`rope_passes.proofs.mask_lengths` (the main graph, or one
call of a model-local function at its own opset, its reference attributes bound to the call's): every value is a
:class:`~rope_passes.proofs.mask_values.MaskRows`, :class:`~rope_passes.proofs.mask_values.RowSums`,
:class:`~rope_passes.proofs.known.Known` or :class:`~rope_passes.proofs.mask_values.Broken` (the module docstring of
:mod:`rope_passes.proofs.mask_lengths` says what each step keeps)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
import rope_passes.proofs.mask_moves as moves
import rope_passes.proofs.mask_steps as steps
from rope_passes.analysis.graph import attr, constant_node_value
from rope_passes.proofs.constants import Constants
from rope_passes.proofs.dims import Affine, Foreign, affine_sum
from rope_passes.proofs.known import (
    NARY,
    OPAQUE,
    SMALL,
    UNARY,
    UNKNOWN_VARYING,
    Dim,
    Known,
    arg_of_concat,
    const,
    known_op,
    known_values,
)
from rope_passes.proofs.mask_values import (
    INT_TYPES,
    Broken,
    MaskRows,
    MaskShape,
    RowSums,
    RowTest,
    Unfollowed,
    Val,
    broken,
    mask_like,
    mask_problem,
    opset_in,
)

#: the steps that move a view of the mask (or its row sums) without changing its elements
_MOVES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Expand", "Tile", "CumSum", "Gather"})


#: what a row-sum blame is kept for (the node that last changed it, for a refusal's words)
_BLAMED = ("form", "axes")
#: the ops that compute on values (where the width may turn into a value not proved to be it), not move them
_COMPUTES = UNARY | NARY | {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ArgMax", "ArgMin"}


def _width_in(vals: list) -> bool:
    """Some value of ``vals`` holds the mask's width (itself or an affine form of it)."""
    return any(isinstance(a, Known) and a.values is not None and a.values.dtype == object and any(
        x == Dim(1) or (isinstance(x, Affine) and x.dim == Dim(1)) for x in a.values.reshape(-1).tolist()) for a in vals)


class Owner(Protocol):
    """What a walk reads of the proof it serves (:class:`rope_passes.proofs.mask_lengths.MaskLengths`)."""

    names: frozenset[str]  # the attention mask's possible graph input names
    constants: Constants  # the one constant evaluator
    functions: dict[tuple[str, str, str], ir.Function]  # the model-local functions by identifier
    opset: int  # the model's default-domain opset

MAX_DEPTH = 16  # nested model-local function calls evaluated


class Walk:
    """One abstract evaluation (of the main graph, or of one call of a model-local function: ``seeds``)."""

    def __init__(self, owner: Owner, opset: int, seeds: dict[int, Val], depth: int = 0,
                 bound: dict[str, ir.Attr] | None = None) -> None:
        self.owner = owner
        self.bound = bound or {}  # a function call's attributes, by name (what a body's reference attribute reads)
        self.depth = depth  # model-local function calls evaluated around this one
        self.opset = opset
        self.vals: dict[int, Val] = dict(seeds)
        self.seeds = set(seeds)
        self.touched: list[ir.Value] = []  # rank-2 integer graph inputs whose shape or values the cone reads
        self.read_values = False  # the cone reads such an input's values
        self.read_shape = False  # the cone reads such an input's shape (Shape / Size)
        self.widened: list[ir.Node] = []  # Pad nodes that add columns to a view of the mask
        self.divided: list[ir.Node] = []  # Div / Mod nodes dividing by a call dimension
        self.mask: ir.Value | None = None  # the attention mask, where the cone reads its shape
        self.lost: ir.Node | None = None  # the first node taking the mask's width to a value not known to be it
        self.mixed: Foreign | None = None  # another input's dimension that node combined the width with
        self.blame: dict[tuple[int, str], ir.Node] = {}  # (id(RowSums), what) -> the node that last moved it
        self.spoiled: list[Broken] = []  # why values read from a tensor of the mask's shape are not the mask's

    def blame_name(self, value: ir.Value, what: str = "form") -> str:
        node = self.blame.get((id(value), what))
        return f"{node.op_type} {node.name!r}" if node is not None else "the mask's sum"

    def value(self, root: ir.Value) -> Val:
        return graph_walk.post_order(root, self.vals, self._leaf, self._outputs, self._constant)

    def _constant(self, v: ir.Value) -> Val | None:
        """A produced value the one constant evaluator knows (not a Constant node: :meth:`_node` reads those)."""
        producer = v.producer()
        array = self.owner.constants(v) if producer is not None and producer.op_type != "Constant" else None
        if array is None:
            return None
        return Known.of(array) if array.size <= SMALL else UNKNOWN_VARYING

    def _outputs(self, node: ir.Node) -> list[Val]:
        outs = self._node(node)
        for o, a in zip(node.outputs, outs, strict=True):
            if isinstance(a, RowSums):  # the nodes that last moved the offset / the axes, for a refusal's words
                src = next((i for i in node.inputs if i is not None
                            and isinstance(self.vals.get(id(i)), RowSums)), None)
                before = self.vals.get(id(src)) if src is not None else None
                for what in _BLAMED:
                    same = isinstance(before, RowSums) and getattr(before, what) == getattr(a, what)
                    inner = self.blame.get((id(o), what))  # a function call: the body's node (set by _call)
                    self.blame[(id(o), what)] = inner or (self.blame.get((id(src), what), node) if same else node)
        return outs

    def _leaf(self, v: ir.Value) -> Val:
        if v.is_graph_input():
            if mask_like(v):
                if v not in self.touched:
                    self.touched.append(v)
                if mask_problem(v, self.owner.names) is None:
                    self.mask = v
                return MaskRows(v, ("b", "t"), Dim(1) if self.mask is v else Foreign(v.name, 1))
            return Known(tuple(d if isinstance(d, int) else Foreign(v.name, i) for i, d in enumerate(v.shape))
                         if v.shape is not None else None,
                         None, None, True)
        if v.const_value is not None:
            return const(v.const_value)
        return Broken(f"{v.name!r} is neither a graph input nor a constant")

    # -- one node -------------------------------------------------------------------------------------------------
    def _node(self, node: ir.Node) -> list[Val]:
        n = len(node.outputs)
        key = (node.domain, node.op_type, getattr(node, "overload", ""))
        if key in self.owner.functions:
            return self._call(node, self.owner.functions[key])
        ins = [None if v is None else self.vals[id(v)] for v in node.inputs]
        failed = next((a for a in ins if isinstance(a, Broken)), None)
        if failed is not None:
            self.read_shape = self.read_shape or (node.op_type in ("Shape", "Size") and bool(self.touched))
            return [failed] * n
        if node.domain not in ("", "ai.onnx"):
            return [broken(node, "is a custom op: the proof does not follow it")] * n
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return [broken(node, "is control flow: the proof does not follow it")] * n
        node = self._resolved(node)
        if node.op_type == "Constant":  # read off the node (a function body's may take its value from the call)
            array = constant_node_value(node) if node.outputs[0].producer() is not node else \
                self.owner.constants(node.outputs[0])
            return [Known.of(array) if array is not None and array.size <= SMALL else UNKNOWN_VARYING]
        if any(isinstance(a, RowTest) for a in ins):
            self.read_values = True
            return [steps.tested(node, ins)] * n
        rows = [a for a in ins if isinstance(a, (MaskRows, RowSums))]
        if not rows:
            shaped = [a for a in ins if isinstance(a, MaskShape)]
            if shaped and node.op_type in ("Shape", "Size"):
                self.read_shape = True
            elif shaped and shaped[0].why is not None and shaped[0].why not in self.spoiled:
                self.spoiled.append(shaped[0].why)
            divisor = ins[1] if node.op_type in ("Div", "Mod") and len(ins) > 1 else None
            if isinstance(divisor, Known) and divisor.values is not None and divisor.values.dtype == object:
                self.divided.append(node)  # by a call dimension: for a refusal's words
            outs: list[Val] = list(known_op(node, ins, self.opset))  # type: ignore[arg-type]
            if node.op_type in ("ArgMax", "ArgMin") and node.inputs[0] is not None:
                outs = [arg_of_concat(node, self.vals.get) or outs[0]]
            if self.lost is None and node.op_type in _COMPUTES and _width_in(ins) and not _width_in(outs):
                self.lost = node  # the first node that takes the width to a value not known to be it
                self.mixed = next((x for a in ins if isinstance(a, Known) and a.values is not None
                                   for x in a.values.reshape(-1).tolist() if isinstance(x, Foreign)), None)
            return outs
        self.read_values = self.read_values or node.op_type not in ("Shape", "Size")
        self.read_shape = self.read_shape or node.op_type in ("Shape", "Size")
        if len({id(r.source) for r in rows}) > 1:
            return [broken(node, "mixes two graph inputs' values")] * n
        if node.op_type in ("Equal", "GreaterOrEqual", "LessOrEqual") and len(ins) == 2 and ins[0] == ins[1]:
            return [self._uniform(ins[0], True)]  # type: ignore[arg-type]  # x == x: true for every integer
        if node.op_type == "Where" and len(ins) == 3 and isinstance(ins[0], Known):
            chosen = self._select(ins)
            if chosen is not None:
                return [chosen]
        if node.op_type == "Concat":
            return [self._concat(node, ins)]
        try:
            if node.op_type in steps.FLIPPED and len(ins) == 2:
                return [steps.compare(node, ins)]
            if node.op_type == "Sub" and len(ins) == 2 and not isinstance(ins[0], (MaskRows, RowSums)):
                return [steps.subtracted_from(ins[1], ins[0])]
        except Unfollowed as e:
            return [broken(node, str(e))] * n
        if node.op_type in ("Add", "Mul") and len(ins) == 2 and not isinstance(ins[0], (MaskRows, RowSums)):
            ins = ins[::-1]  # commutative: the rows first
        x = ins[0]
        if not isinstance(x, (MaskRows, RowSums)):
            return [broken(node, "reads the mask's values through an index, shape or second operand")] * n
        try:
            return self._rows_op(node, x, ins)
        except Unfollowed as e:
            return [broken(node, str(e))] * n

    def _call(self, node: ir.Node, function: ir.Function) -> list[Val]:
        """A model-local function, evaluated in place at its own opset (its inputs bound to the call's values, its
        attributes to the call's, or the function's defaults: what onnxruntime's inlining substitutes)."""
        if self.depth >= MAX_DEPTH:
            return [broken(node, f"calls functions {MAX_DEPTH} deep (recursion?): not evaluated")] * len(node.outputs)
        opset = opset_in(function.opset_imports, self.opset)
        seeds = {id(p): self.vals[id(a)] if a is not None else Broken("an absent function input")
                 for p, a in zip(function.inputs, node.inputs, strict=False)}
        bound = {a.name: a for a in function.attributes.values() if a.value is not None}
        bound.update({k: a for k, a in self._resolved(node).attributes.items()})
        inner = Walk(self.owner, opset, seeds, self.depth + 1, bound)
        outs = [inner.value(o) for o in function.outputs]
        self.adopt(inner)
        for out, body in zip(node.outputs, function.outputs, strict=False):  # refusals name the body's nodes
            for what in _BLAMED:
                if (id(body), what) in inner.blame:
                    self.blame[(id(out), what)] = inner.blame[(id(body), what)]
        return outs

    def _resolved(self, node: ir.Node) -> ir.Node:
        """``node`` with its reference attributes (a function body's ``ref_attr_name``) replaced by the call's values,
        as a detached copy reading nothing (the walk reads its inputs' values itself); ``node`` when it has none."""
        if not any(a.is_ref() for a in node.attributes.values()):
            return node
        attrs = []
        for name, a in node.attributes.items():
            if not a.is_ref():
                attrs.append(a)
            elif a.ref_attr_name in self.bound:  # an unbound reference is an absent attribute (the ONNX rule)
                attrs.append(ir.Attr(name, self.bound[a.ref_attr_name].type, self.bound[a.ref_attr_name].value))
        return ir.Node(node.domain, node.op_type, [], attrs, overload=node.overload, num_outputs=len(node.outputs),
                       version=node.version, name=node.name)

    def _extents(self, x: Val | None) -> tuple | None:
        """The extents of ``x`` per axis (``Dim(0)`` the mask's batch, its width, ints; OPAQUE: set per call)."""
        if isinstance(x, Known):
            return x.shape
        if not isinstance(x, (MaskRows, RowSums)):
            return None
        own = mask_problem(x.source, self.owner.names) is None
        return tuple(Dim(0) if a == "b" and own else Foreign(x.source.name, 0) if a == "b" else
                     (x.width if isinstance(x, MaskRows) else OPAQUE) if a == "t" else 1 for a in x.axes)

    def _uniform(self, x: MaskRows | RowSums, fill: object) -> Known:
        """A tensor shaped like ``x`` whose every element is ``fill`` (it no longer reads the mask's values)."""
        shape = self._extents(x)
        assert shape is not None
        ones = (1,) * len(shape)
        return Known(shape, ones, np.full(ones, fill), False)

    def _select(self, ins: list[Val | None]) -> Val | None:
        """``Where(c, a, b)`` with ``c`` known true (false) everywhere: ``a`` (``b``), where neither other input
        broadcasts the choice to another shape (None otherwise: not followed)."""
        cond = ins[0].values if isinstance(ins[0], Known) else None
        if cond is None or cond.dtype != bool or not (cond.all() or not cond.any()):
            return None
        pick = 1 if cond.all() else 2
        chosen = self._extents(ins[pick])
        if chosen is None:
            return None
        for other in (ins[0], ins[3 - pick]):
            shape = self._extents(other)
            if shape is None or len(shape) > len(chosen):
                return None
            for ext, mine in zip(reversed(shape), reversed(chosen)):
                if ext != 1 and (ext is OPAQUE or ext != mine):
                    return None
        return ins[pick]

    def adopt(self, other: Walk) -> None:
        """What ``other`` (a walk of a function call, or of the call's arguments) found about the inputs it read."""
        for v in other.touched:
            if v not in self.touched:
                self.touched.append(v)
        self.read_values = self.read_values or other.read_values
        self.read_shape = self.read_shape or other.read_shape
        self.mask = self.mask or other.mask
        self.lost, self.mixed = (self.lost, self.mixed) if self.lost is not None else (other.lost, other.mixed)
        self.widened.extend(n for n in other.widened if n not in self.widened)
        self.divided.extend(n for n in other.divided if n not in self.divided)

    def fresh(self) -> Walk:
        """A new walk of the same scope (its seeds and what its arguments' walk found), for one more proof."""
        walk = Walk(self.owner, self.opset, {k: v for k, v in self.vals.items() if k in self.seeds}, self.depth,
                     self.bound)
        walk.adopt(self)
        return walk

    def _rows_op(self, node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None]) -> list[Val]:
        op = node.op_type
        if op == "Shape":
            dims = list(self._extents(x) or ())
            start, end = attr(node, "start", 0), attr(node, "end", None)
            return [Known.of(np.array(dims[start:end], dtype=object))]
        if op == "Size":
            return [Known((), (), np.array(OPAQUE, dtype=object), True)]
        if op == "Identity":
            return [x]
        if op == "CastLike":  # to the type of its second input
            target = node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] is not None else None
            like = known_values(ins[1]) if len(ins) > 1 else None
            dtype = target if target is not None else ir.DataType.from_numpy(like.dtype) if like is not None \
                and like.dtype != object else None
            if dtype not in INT_TYPES:
                return [self._cast_away(node, x, steps.cast_words(x, dtype, "like a "))]
            return [x]
        if op == "Cast":
            if ir.DataType(attr(node, "to")) not in INT_TYPES:
                return [self._cast_away(node, x, steps.cast_words(x, ir.DataType(attr(node, "to"))))]
            return [x]
        if op == "Neg":
            return [x.moved(-x.scale, -x.offset) if isinstance(x, RowSums) else
                    dataclasses.replace(x, scale=-x.scale, extra=-x.extra)]
        if op in _MOVES:
            return [self._moved(node, x, ins)]
        if op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
            return [steps.arith(node, x, ins, self.vals, self._uniform)]
        if isinstance(x, RowSums):
            raise Unfollowed("computes on the row sums in a way the proof does not follow (it follows Add, Sub, Mul "
                             "and Neg by integer constants, an exact Div, comparisons with constants and a Where "
                             "they decide)")
        if isinstance(x, MaskRows) and x.running and op in ("ReduceSum", "Pad"):
            raise Unfollowed("reads running sums (CumSum) in a way the proof does not follow")
        if op == "ReduceSum":
            return [steps.reduce(node, x, ins)]
        if op == "Pad":
            padded, added = steps.pad(node, x, ins)
            if added:
                self.widened.append(node)
            return [padded]
        if op == "Slice":
            return [steps.slice(node, x, ins)]
        raise Unfollowed("reads the mask's values in a way the proof does not follow")

    def _moved(self, node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None]) -> Val:
        """The steps that move the view without changing its elements (:mod:`rope_passes.proofs.mask_moves`)."""
        op = node.op_type
        if op == "Transpose":
            perm = attr(node, "perm", None)
            return dataclasses.replace(x, axes=moves.transpose(x.axes, None if perm is None else list(perm)))
        if op == "Reshape":
            axes = moves.reshape(x.axes, self._extents(x), steps.entries(ins, 1, "shape"),
                                 bool(attr(node, "allowzero", 0)))
        elif op == "Expand":
            axes = moves.expand(x.axes, self._extents(x), steps.entries(ins, 1, "shape"))
        elif op == "Tile":
            moves.tile(steps.ints(node, ins, 1, "repeats") or [])
            axes = x.axes
        elif op == "CumSum":
            given = steps.ints(node, ins, 1, "axis") or []
            if len(given) != 1:
                raise Unfollowed("takes no single axis")
            axis = given[0]
            return moves.cumsum(x, axis, bool(attr(node, "exclusive", 0)), bool(attr(node, "reverse", 0)))
        elif op == "Gather":
            index = known_values(ins[1]) if len(ins) > 1 else None
            if index is None:
                raise Unfollowed("takes its indices from a value not known before the call")
            return moves.gather(x, index, int(attr(node, "axis", 0)))
        else:
            given = steps.ints(node, ins, 1, "axes") if op != "Flatten" else None
            axes = moves.unit_moves(op, x.axes, given, int(attr(node, "axis", 1)))
        return dataclasses.replace(x, axes=axes)

    def _concat(self, node: ir.Node, ins: list[Val | None]) -> Val:
        """A ``Concat`` of the mask (or its sums) with anything: a tensor of the joined shape (the extents along the
        axis added: ``Concat(mask, mask, axis=1)`` is ``2 * width`` wide) whose elements are not one row's each."""
        found = [self._extents(a) for a in ins]
        exts = [e for e in found if e is not None]
        if not exts or len(exts) != len(found) or any(len(e) != len(exts[0]) for e in exts) or not exts[0]:
            return broken(node, "joins the mask with a value of unknown shape")
        rank = len(exts[0])
        axis = int(attr(node, "axis", 0)) % rank
        out = list(exts[0])
        total: object = 0
        for e in exts:
            total = affine_sum(total, e[axis])
        out[axis] = total
        why = broken(node, f"joins the mask's elements with others along axis {axis}: they are no longer one row each")
        return MaskShape(tuple(out), None, None, True, why)

    def _cast_away(self, node: ir.Node, x: MaskRows | RowSums, words: str) -> Val:
        """A cast of the mask's values to a type that does not keep them: its shape stays the mask's (``Shape`` reads
        it), its elements are not the mask's (a value read from them carries why)."""
        return MaskShape(self._extents(x), None, None, True, broken(node, words))


__all__ = ["MAX_DEPTH", "Walk"]
