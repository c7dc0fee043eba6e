"""GroupQueryAttention's two length inputs proved by value from the attention mask, whatever nodes compute them.

``total-seq-on-gpu`` needs two facts about a graph: ``total_sequence_length`` is the width of the attention mask
``M [batch, total]`` (what ``Shape(M)[1]`` gives), and ``seqlens_k`` is each row's sum minus one (``[batch]``, or
``[batch, 1, ...]``: GroupQueryAttention reads it by flat index). This module proves them by evaluating the value's
cone abstractly, one node at a time, in the form that node's own opset gives it (``Squeeze``/``Unsqueeze``/
``ReduceSum``/``Split`` axes as an attribute or an input, ``Shape`` with ``start``/``end``, ``Split`` with
``num_outputs``, ``Slice``, ``Pad``, ``Cast``/``Identity`` chains, ``Add(x, -1)`` for ``Sub(x, 1)``, model-local
functions with their own opset import, evaluated in place for the analysis). Every value of the cone is one of

* :class:`~rope_passes.proofs.mask_values.MaskRows`: the elements of a rank-2 integer graph input, moved (its axes:
  ``"b"`` the batch, ``"t"`` the columns, ``1`` unit axes), with ``extra`` added to every row's sum by ``Pad``
  columns;
* :class:`~rope_passes.proofs.mask_values.RowSums`: ``sum(row) + offset`` per row (axes ``"b"`` and unit axes);
* :class:`~rope_passes.proofs.known.Known`: shape arithmetic and constants, run by the one evaluator
  (:func:`rope_passes.proofs.known.known_op`; constants by :mod:`rope_passes.proofs.constants`), the mask's
  dimensions as the symbols ``Dim(0)`` (batch) and ``Dim(1)`` (width);
* :class:`~rope_passes.proofs.mask_values.Broken`: a node the proof cannot follow, with the reason naming it (kept,
  not raised: only a broken value that reaches the GQA input matters).

Exact for every mask: each step keeps the value it claims (an integer ``Cast`` to int32/int64 keeps a 0/1 mask and
every row sum below 2^31; a ``Cast`` to another type, a ``Slice`` or a ``Pad`` along the batch, a sum over another axis,
``Squeeze`` without axes, arithmetic other than adding a constant to the sums is ``Broken``, naming the node). A value
of a model-local function's body is proved for one call (:meth:`MaskLengths.scope`), the function at its own opset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import numpy as np
import onnx_ir as ir

import rope_passes.graph_walk as graph_walk
from rope_passes.analysis.graph import ancestors, attr
from rope_passes.proofs.constants import Constants
from rope_passes.proofs.known import OPAQUE, SMALL, UNKNOWN_VARYING, Dim, Known, const, known_op, known_values
from rope_passes.proofs.mask_values import (
    INT_TYPES,
    MASK_INPUT,
    Broken,
    MaskRows,
    RowSums,
    Val,
    broken,
    mask_like,
    mask_problem,
    opset_in,
    show,
)
from rope_passes.report import MatchFailure


@dataclasses.dataclass
class Proved:
    mask: ir.Value
    nodes: list[ir.Node]  # the main graph's nodes of the cone (removed by the pass where nothing else reads them)


_MAX_DEPTH = 16  # nested model-local function calls evaluated


class MaskLengths:
    """Proves GQA length inputs of one model from its attention mask (``mask_names``: the names it may have)."""

    def __init__(self, model: ir.Model, mask_names: Collection[str] = (MASK_INPUT,)) -> None:
        self.model = model
        self.names = frozenset(mask_names)
        self.constants = Constants()
        self.functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions.values()}
        self.opset = opset_in(model.opset_imports, 18)

    # -- the two facts ------------------------------------------------------------------------------------------
    def scope(self, call: ir.Node, function: ir.Function) -> _Walk:
        """A walk of ``function``'s body for the call ``call`` (its parameters bound to the call's arguments, as
        the main graph computes them), at the function's own opset: what :meth:`total`/:meth:`seqlens` read a value
        of the body in."""
        outer = _Walk(self, self.opset, {})
        seeds = {id(p): outer.value(a) if a is not None else Broken("an absent function input")
                 for p, a in zip(function.inputs, call.inputs, strict=False)}
        inner = _Walk(self, opset_in(function.opset_imports, self.opset), seeds, 1)
        inner.adopt(outer)
        return inner

    def parameter(self, walk: _Walk, function: ir.Function, mask: ir.Value) -> ir.Value | None:
        """The parameter of ``function`` that ``walk``'s call binds to ``mask`` itself (its elements, unmoved)."""
        return next((p for p in function.inputs if walk.vals.get(id(p)) == MaskRows(mask, ("b", "t"), Dim(1))), None)

    def total(self, value: ir.Value, scope: _Walk | None = None) -> Proved:
        """``value`` is the mask's width; MatchFailure otherwise (refused where its cone reads the shape of a rank-2
        integer input: a length chain the proof could not follow; not matched where it reads none, e.g. the builder's
        ``_graph`` variant's largest row sum, computed on the GPU already)."""
        walk = scope.fresh() if scope is not None else _Walk(self, self.opset, {})
        val = walk.value(value)
        if isinstance(val, Known):
            values = known_values(val)
            if values is not None and values.size == 1 and values.reshape(-1)[0] == Dim(1) and walk.mask is not None:
                return Proved(walk.mask, ancestors([value]))
        why = self._why(walk, val, "total_sequence_length", "the mask's width (Shape(mask)[1])", value)
        if walk.read_shape:
            raise MatchFailure.refuse(why, value)
        raise MatchFailure.absent(why, value)

    def seqlens(self, value: ir.Value, scope: _Walk | None = None) -> Proved:
        """``value`` is the mask's row sums minus one, the batch on axis 0; MatchFailure otherwise (refused where its
        cone reads a rank-2 integer input's values, not matched where it reads none)."""
        walk = scope.fresh() if scope is not None else _Walk(self, self.opset, {})
        val = walk.value(value)
        if isinstance(val, RowSums) and val.axes[:1] == ("b",) and all(a == 1 for a in val.axes[1:]):
            problem = mask_problem(val.source, self.names)
            if problem is None and val.offset == -1:
                return Proved(val.source, ancestors([value]))
            padded = "".join(f"; {n.op_type} {n.name!r} adds columns to each row" for n in walk.widened)
            why = problem or (f"seqlens_k is the row sums of {val.source.name!r} {val.offset:+d}, not the row sums - 1 "
                              f"(last changed by {walk.blame_name(value)}{padded})")
            raise MatchFailure.refuse(why, value)
        why = self._why(walk, val, "seqlens_k", "the mask's row sums - 1 ([batch])", value)
        if walk.read_values:
            raise MatchFailure.refuse(why, value)
        raise MatchFailure.absent(why, value)

    def _why(self, walk: _Walk, val: Val, what: str, expected: str, value: ir.Value) -> str:
        if isinstance(val, Broken):
            return f"{what} is not proved to be {expected}: {val.reason}"
        others = [v for v in walk.touched if mask_problem(v, self.names)]
        if others:
            return f"{what} is not {expected}: {mask_problem(others[0], self.names)}"
        node = value.producer()
        by = f"{node.op_type} {node.name!r}" if node is not None else repr(value.name)
        moved = (f" (shaped so by {walk.blame_name(value, 'axes')}; GroupQueryAttention reads the batch on axis 0, "
                 "every other axis 1)") if isinstance(val, RowSums) and what == "seqlens_k" else ""
        widened = (f" ({walk.widened[0].op_type} {walk.widened[0].name!r} gives the mask another width)"
                   if walk.widened and what == "total_sequence_length" else "")
        return f"{what} is not {expected}: {by} computes {show(val, walk.mask)}{moved}{widened}"


class _Walk:
    """One abstract evaluation (of the main graph, or of one call of a model-local function: ``seeds``)."""

    def __init__(self, owner: MaskLengths, opset: int, seeds: dict[int, Val], depth: int = 0) -> None:
        self.owner = owner
        self.depth = depth  # model-local function calls evaluated around this one
        self.opset = opset
        self.vals: dict[int, Val] = dict(seeds)
        self.seeds = set(seeds)
        self.touched: list[ir.Value] = []  # rank-2 integer graph inputs whose shape or values the cone reads
        self.read_values = False  # the cone reads such an input's values
        self.read_shape = False  # the cone reads such an input's shape (Shape / Size)
        self.widened: list[ir.Node] = []  # Pad nodes that add columns to a view of the mask
        self.mask: ir.Value | None = None  # the attention mask, where the cone reads its shape
        self.blame: dict[tuple[int, str], ir.Node] = {}  # (id(RowSums), what) -> the node that last moved it

    def blame_name(self, value: ir.Value, what: str = "offset") -> str:
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
                for what in ("offset", "axes"):
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
                return MaskRows(v, ("b", "t"), Dim(1) if self.mask is v else OPAQUE)
            return Known(tuple(d if isinstance(d, int) else OPAQUE for d in v.shape) if v.shape is not None else None,
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
            return [failed] * n
        if node.domain not in ("", "ai.onnx"):
            return [broken(node, "is a custom op: the proof does not follow it")] * n
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return [broken(node, "is control flow: the proof does not follow it")] * n
        if node.op_type == "Constant":
            array = self.owner.constants(node.outputs[0])
            return [Known.of(array) if array is not None and array.size <= SMALL else UNKNOWN_VARYING]
        rows = [a for a in ins if isinstance(a, (MaskRows, RowSums))]
        if not rows:
            return list(known_op(node, ins, self.opset))  # type: ignore[arg-type]
        self.read_values = self.read_values or node.op_type not in ("Shape", "Size")
        self.read_shape = self.read_shape or node.op_type in ("Shape", "Size")
        if len({id(r.source) for r in rows}) > 1:
            return [broken(node, "mixes two graph inputs' values")] * n
        if node.op_type in ("Add", "Mul") and len(ins) == 2 and not isinstance(ins[0], (MaskRows, RowSums)):
            ins = ins[::-1]  # commutative: the rows first
        x = ins[0]
        if not isinstance(x, (MaskRows, RowSums)):
            return [broken(node, "reads the mask's values through an index, shape or second operand")] * n
        try:
            return self._rows_op(node, x, ins)
        except _Unknown as e:
            return [broken(node, str(e))] * n

    def _call(self, node: ir.Node, function: ir.Function) -> list[Val]:
        """A model-local function, evaluated in place at its own opset (its inputs bound to the call's values)."""
        if function.attributes:
            return [broken(node, "calls a model-local function with attributes: not evaluated")] * len(node.outputs)
        if self.depth >= _MAX_DEPTH:
            return [broken(node, f"calls functions {_MAX_DEPTH} deep (recursion?): not evaluated")] * len(node.outputs)
        opset = opset_in(function.opset_imports, self.opset)
        seeds = {id(p): self.vals[id(a)] if a is not None else Broken("an absent function input")
                 for p, a in zip(function.inputs, node.inputs, strict=False)}
        inner = _Walk(self.owner, opset, seeds, self.depth + 1)
        outs = [inner.value(o) for o in function.outputs]
        self.adopt(inner)
        for out, body in zip(node.outputs, function.outputs, strict=False):  # refusals name the body's nodes
            for what in ("offset", "axes"):
                if (id(body), what) in inner.blame:
                    self.blame[(id(out), what)] = inner.blame[(id(body), what)]
        return outs

    def adopt(self, other: _Walk) -> None:
        """What ``other`` (a walk of a function call, or of the call's arguments) found about the inputs it read."""
        for v in other.touched:
            if v not in self.touched:
                self.touched.append(v)
        self.read_values = self.read_values or other.read_values
        self.read_shape = self.read_shape or other.read_shape
        self.mask = self.mask or other.mask
        self.widened.extend(n for n in other.widened if n not in self.widened)

    def fresh(self) -> _Walk:
        """A new walk of the same scope (its seeds and what its arguments' walk found), for one more proof."""
        walk = _Walk(self.owner, self.opset, {k: v for k, v in self.vals.items() if k in self.seeds}, self.depth)
        walk.adopt(self)
        return walk

    def _rows_op(self, node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None]) -> list[Val]:
        op = node.op_type
        if op == "Shape":
            own = mask_problem(x.source, self.owner.names) is None
            dims = [Dim(0) if a == "b" and own else OPAQUE if a in ("b", "t") else a for a in x.axes]
            if isinstance(x, MaskRows):
                dims = [x.width if a == "t" else d for a, d in zip(x.axes, dims, strict=True)]
            start, end = attr(node, "start", 0), attr(node, "end", None)
            return [Known.of(np.array(dims[start:end], dtype=object))]
        if op == "Size":
            return [Known((), (), np.array(OPAQUE, dtype=object), True)]
        if op == "Identity":
            return [x]
        if op == "Cast":
            if ir.DataType(attr(node, "to")) not in INT_TYPES:
                raise _Unknown(f"casts the mask's values to {ir.DataType(attr(node, 'to')).name}: values it cannot "
                               "hold exactly (or rounds) change the sums")
            return [x]
        if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten"):
            return [dataclasses.replace(x, axes=self._reshape(node, x, ins))]
        if op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
            return [self._arith(node, x, ins)]
        if isinstance(x, RowSums):
            raise _Unknown("computes on the row sums beyond adding a constant")
        if op == "ReduceSum":
            return [self._reduce(node, x, ins)]
        if op == "Pad":
            return [self._pad(node, x, ins)]
        if op == "Slice":
            return [self._slice(node, x, ins)]
        raise _Unknown("reads the mask's values in a way the proof does not follow")

    # -- the steps ------------------------------------------------------------------------------------------------
    def _ints(self, node: ir.Node, ins: list[Val | None], index: int, name: str) -> list[int] | None:
        if len(ins) > index and ins[index] is not None:
            values = known_values(ins[index])
            if values is None or values.dtype == object:
                raise _Unknown(f"takes its {name} from a value not known before the call")
            return [int(v) for v in values.reshape(-1)]
        value = attr(node, name, None)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def _reshape(self, node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None]) -> tuple:
        axes = list(x.axes)
        op = node.op_type
        if op == "Unsqueeze":
            new = self._ints(node, ins, 1, "axes") or []
            rank = len(axes) + len(new)
            for a in sorted(a % rank for a in new):
                axes.insert(a, 1)
            return tuple(axes)
        if op == "Squeeze":
            drop = self._ints(node, ins, 1, "axes")
            if drop is None:
                raise _Unknown("has no axes: it squeezes the batch too when the batch is 1")
            drop_set = {a % len(axes) for a in drop}
            if any(axes[a] != 1 for a in drop_set):
                raise _Unknown("squeezes an axis that is not a unit axis")
            return tuple(a for i, a in enumerate(axes) if i not in drop_set)
        if op == "Flatten":
            cut = int(attr(node, "axis", 1)) % (len(axes) + 1)
            groups = [axes[:cut], axes[cut:]]
        else:
            shape = self._ints(node, ins, 1, "shape")
            if shape is None or attr(node, "allowzero", 0):
                raise _Unknown("reshapes to a shape not known")
            big = [a for a in axes if a != 1]
            out: list = []
            for i, entry in enumerate(shape):
                if entry == 1:
                    out.append(1)
                elif (entry == -1 or (entry == 0 and i < len(axes) and axes[i] != 1)) and len(big) == 1:
                    out.append(big[0])
                else:
                    raise _Unknown(f"reshapes {tuple(axes)} to {shape}: not only unit axes moved")
            if [a for a in out if a != 1] != big:
                raise _Unknown(f"reshapes {tuple(axes)} to {shape}: not only unit axes moved")
            return tuple(out)
        if any(len([a for a in g if a != 1]) > 1 for g in groups):
            raise _Unknown("flattens the batch with the columns")
        return tuple(next((a for a in g if a != 1), 1) for g in groups)

    def _arith(self, node: ir.Node, x: MaskRows | RowSums, ins: list[Val | None]) -> Val:
        other = ins[1]
        values = known_values(other) if isinstance(other, Known) and not other.varies else None
        if values is None or values.dtype == object or values.size != 1 or values.dtype.kind not in "iu":
            name = next((v.name for v in node.inputs if v is not None
                         and not isinstance(self.vals.get(id(v)), (MaskRows, RowSums))), "?")
            raise _Unknown(f"combines the mask's values with {name!r}, not an integer constant "
                           "(an initializer that is also a graph input can be overridden by the caller)")
        k = int(values.reshape(-1)[0])
        axes = (1,) * max(0, values.ndim - len(x.axes)) + tuple(x.axes)
        op = node.op_type
        if (op in ("Add", "Sub") and k == 0) or (op in ("Mul", "Div") and k == 1):
            return dataclasses.replace(x, axes=axes)
        if isinstance(x, RowSums) and op in ("Add", "Sub"):
            return RowSums(x.source, axes, x.offset + (k if op == "Add" else -k))
        if isinstance(x, RowSums):
            raise _Unknown(f"scales the row sums by {k} ({op})")
        raise _Unknown(f"{op}s {k} to every element of the mask: every row's sum changes by a multiple of the width")

    def _reduce(self, node: ir.Node, x: MaskRows, ins: list[Val | None]) -> Val:
        axes = self._ints(node, ins, 1, "axes")
        if not axes:
            if attr(node, "noop_with_empty_axes", 0):
                return x
            axes = list(range(len(x.axes)))
        summed = {a % len(x.axes) for a in axes}
        kinds = {x.axes[a] for a in summed} - {1}
        if kinds != {"t"}:
            raise _Unknown(f"sums axes {sorted(summed)} ({', '.join(map(str, sorted(map(str, kinds))))}), "
                           "not the mask's columns alone")
        keep = attr(node, "keepdims", 1)
        out = tuple(1 if i in summed else a for i, a in enumerate(x.axes) if keep or i not in summed)
        return RowSums(x.source, out, x.extra)

    def _pad(self, node: ir.Node, x: MaskRows, ins: list[Val | None]) -> Val:
        if str(attr(node, "mode", "constant")) not in ("constant", "b'constant'"):
            raise _Unknown("pads by copying the mask's values (not mode=constant)")
        pads = self._ints(node, ins, 1, "pads")
        rank = len(x.axes)
        axes = self._ints(node, ins, 3, "axes") or list(range(rank))
        fill = known_values(ins[2]) if len(ins) > 2 and ins[2] is not None else np.array(attr(node, "value", 0))
        if pads is None or fill is None or fill.dtype == object or len(pads) != 2 * len(axes):
            raise _Unknown("pads by amounts or a value not known before the call")
        value = int(np.asarray(fill).reshape(-1)[0])
        added = 0
        for i, a in enumerate(axes):
            before, after = pads[i], pads[i + len(axes)]
            if before < 0 or after < 0:
                raise _Unknown("crops the mask (negative pads)")
            if before or after:
                if x.axes[a % rank] != "t":
                    raise _Unknown("pads along the batch: rows the caller did not send")
                added += before + after
        if added:
            self.widened.append(node)
        return MaskRows(x.source, x.axes, x.width if not added else OPAQUE, x.extra + added * value)

    def _slice(self, node: ir.Node, x: MaskRows, ins: list[Val | None]) -> Val:
        starts, ends = self._ints(node, ins, 1, "starts"), self._ints(node, ins, 2, "ends")
        if starts is None or ends is None:
            raise _Unknown("slices by bounds not known before the call")
        axes = self._ints(node, ins, 3, "axes") or list(range(len(starts)))
        steps = self._ints(node, ins, 4, "steps") or [1] * len(starts)
        for s, e, st in zip(starts, ends, steps, strict=True):
            if not (s == 0 and st == 1 and e >= 2**31 - 1):
                raise _Unknown(f"slices the mask ({s}:{e}:{st} on axes {axes}): some of each row is dropped")
        return x


class _Unknown(Exception):
    """A step the proof does not follow (the message says why; the node is added by the caller)."""


__all__ = ["MASK_INPUT", "MaskLengths", "Proved", "mask_problem"]
