"""Cross-cutting attacks (issue 18): values the graph computes trusted as if the caller gave them, constants in forms
a proof may not read, attributes read otherwise than onnxruntime reads them, values a pass removes or rewires that
something else still reads (a graph output, an ``If`` / ``Loop`` body, a copy of a GQA inside an ``If``), names a pass
derives that are already taken, left-padded masks.

* ``narrow-int64``: the token index ``Reshape(Range(0, B*S), [B, S])`` of ``legacy/qwen25_vl/cpu_fp32``, built by
  the graph from a large constant or taken out of int32 and back, so that a narrowed copy would wrap; the builder
  0.18 VL graphs after ``lower-mrope`` with image positions (``webgpu-graph`` without ``--text-only``). Judged on
  whatever the pass narrows, anywhere (placement is the whole graph's).
* ``fold-text-mrope``: MRotaryEmbedding / GQA attributes (``interleaved`` 1 and 2, ``scale``, ``num_heads``,
  ``do_rotary=2``, a preset ``rotary_interleaved``), partial rotary and fp16 models, the rotated q or the position
  input read elsewhere, a taken table name, unnamed nodes, left-padded masks with per-row positions; judged on
  onnxruntime 1.31's MRotaryEmbedding (``reference="plugin"``) or, for the manual forms, the mutant on CPU.
* ``total-seq-on-gpu``: the chains' constants as ``Constant value_int(s)``, ``Cast``, ``Gather(Concat)``; ``Shape``
  start/end; the old lengths read elsewhere; a taken name; left-padded masks.
* ``longrope-concat``: the threshold and the branch tables in other forms (incl. graph inputs), the If's output read
  elsewhere. ``precompute-cos-sin``: the chain's values read elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, LONGROPE_CALLS, REFUSE, Mutant, Work
from .edit import Chain, graph_input, node_named, nodes_of, splice
from .probes import as_graph_output, gqa_copy_in_if, read_in_if, set_attr

NARROW = "narrow-int64"
LEG_QWEN25 = "genai/legacy/qwen25_vl/cpu_fp32"
TWO_32 = 1 << 32
TWO_31 = 1 << 31


def _token_ranges(work: Work) -> list[ir.Node]:
    return [n for n in nodes_of(work.graph, "Range") if "_mrope/Range" in n.name]


def _narrow_places(work: Work) -> list[str]:
    """Every node: placement is a property of the whole graph, so whatever the pass narrows, anywhere, is judged
    (it reports no refusals: a Memcpy it cannot remove just stays)."""
    return [n.name for n in work.graph if n.name]


def range_from(start: int):
    """The token index Range starts at ``start`` (and its end moves with it), and ``start`` is subtracted again after
    the Reshape: the same token index, but the Reshape in between holds values past int32."""
    def edit(work: Work) -> list[str]:
        for rng in _token_ranges(work):
            (reshape,) = [u for u, _ in rng.outputs[0].uses()]
            chain = Chain(work.graph, "range")
            big = chain.scalar(start)
            rng.replace_input_with(0, big)
            end = chain.op("Add", rng.inputs[1], big, shape=ir.Shape([]))
            rng.replace_input_with(1, end)
            chain.insert([rng])
            splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Sub", v, c.scalar(start), shape=v.shape),
                   "range_back")
        work.graph.sort()
        return _narrow_places(work)
    return edit


def out_and_back(offset: int):
    """token index + ``offset`` before the Reshape, - ``offset`` after it: an int64 round trip through values
    outside int32."""
    def edit(work: Work) -> list[str]:
        for rng in _token_ranges(work):
            splice(work.graph, rng.outputs[0], lambda c, v: c.op("Add", v, c.scalar(offset), shape=v.shape), "out")
            (reshape,) = [n for n in work.graph if n.op_type == "Reshape" and n.inputs[0] is not None
                          and n.inputs[0].producer() is not None
                          and n.inputs[0].producer().inputs[0] is rng.outputs[0]]
            splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Sub", v, c.scalar(offset), shape=v.shape),
                   "back")
        return _narrow_places(work)
    return edit


def positions_plus(offset: int):
    """position_ids + ``offset`` - ``offset`` around the per-axis Gather the builder does (a computed value that
    leaves int32 between two ops the pass may narrow)."""
    def edit(work: Work) -> list[str]:
        pos = graph_input(work.graph, "position_ids")
        splice(work.graph, pos, lambda c, v: c.op("Sub", c.op("Add", v, c.scalar(offset)), c.scalar(offset),
                                                  shape=v.shape), "positions")
        return _narrow_places(work)
    return edit


def range_step(step: int):
    """The token index built as ``Range(0, B*S*step, step)`` and divided by ``step`` after the Reshape: the same token
    index, but the Reshape holds ``i * step``, past int32 for a prefill of 2^31 / step tokens (2048 at 2^20): the
    Reshape must stay int64 (no interval proves it fits; the suite's small calls cannot show the wrap)."""
    def edit(work: Work) -> list[str]:
        places = []
        for rng in _token_ranges(work):
            (reshape,) = [u for u, _ in rng.outputs[0].uses()]
            chain = Chain(work.graph, "range_step")
            k = chain.scalar(step)
            rng.replace_input_with(1, chain.op("Mul", rng.inputs[1], k, shape=ir.Shape([])))
            rng.replace_input_with(2, k)
            chain.insert([rng])
            splice(work.graph, reshape.outputs[0], lambda c, v: c.op("Div", v, c.scalar(step), shape=v.shape),
                   "range_step_back")
            places.append(reshape.name)
        work.graph.sort()
        return places
    return edit


def token_index_is_output(direct: bool):
    """Layer 0's q token index (the output of a Reshape the pass narrows) is also a graph output: through an Identity,
    or ``direct``ly (the graph output is the narrowed node's own output value)."""
    def edit(work: Work) -> list[str]:
        (reshape,) = [n for n in work.graph if n.name == "/model/layers.0/attn/q_mrope/PosIds/Reshape"]
        as_graph_output(work.graph, reshape.outputs[0], None if direct else "mutant_token_index")
        return _narrow_places(work)
    return edit


# ------------------------------------------------------------------------------------------------------------
# fold-text-mrope: what it removes, read elsewhere
# ------------------------------------------------------------------------------------------------------------
FOLD = "fold-text-mrope"
CUR_QWEN25 = "genai/current/qwen25_vl/cpu_fp32"
LEG_QWEN35_TEXT = "genai/legacy/qwen35/cpu_fp32_text"
CUR_QWEN35 = "genai/current/qwen35/webgpu_fp32"
CUR_QWEN25_FP16 = "genai/current/qwen25_vl/webgpu_fp16"


def _gqa_places(work: Work) -> list[str]:
    return [n.name for n in nodes_of(work.graph, "GroupQueryAttention")]


def rotated_q_output(direct: bool):
    """Layer 0's rotated q (what GQA stops reading after the fold) is also a graph output (``direct``: the rotation's
    own output value, else through an Identity)."""
    def edit(work: Work) -> list[str]:
        (rot,) = [n for n in work.graph if n.op_type == "MRotaryEmbedding" and "layers.0/attn/q_rotary" in n.name]
        as_graph_output(work.graph, rot.outputs[0], None if direct else "mutant_rotated_q")
        return _gqa_places(work)
    return edit


def positions_read_in_if(places=_gqa_places):
    """position_ids (the input the fold removes when nothing reads it) is also read (cast to float) inside an If
    body."""
    def edit(work: Work) -> list[str]:
        pos = graph_input(work.graph, "position_ids")
        chain = Chain(work.graph, "pos_float")
        as_float = chain.op("Cast", pos, dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
        chain.insert([])
        read_in_if(work.graph, as_float, "mutant_positions_sum")
        return places(work)
    return edit


def positions_read_directly_in_if(work: Work) -> list[str]:
    """position_ids itself is read inside an If body (the outer-scope reference is the graph input)."""
    read_in_if(work.graph, graph_input(work.graph, "position_ids"), "mutant_positions_sum")
    return _gqa_places(work)


def cos_table_output(work: Work) -> list[str]:
    """The manual form's per-token cos (what the fold removes) is also a graph output."""
    rot = next(n for n in work.graph if n.op_type == "RotaryEmbedding")
    as_graph_output(work.graph, rot.inputs[2], "mutant_cos_per_token")
    return _gqa_places(work)


def _rotations(work: Work, which: str = "") -> list[ir.Node]:
    return [n for n in work.graph if n.op_type == "MRotaryEmbedding" and which in n.name]


def rotation_attrs(which: str = "", places=None, **values):
    """Attributes of the MRotaryEmbedding nodes whose name contains ``which`` set (None removes one); the places are
    the GQA nodes (``places`` else)."""
    def edit(work: Work) -> list[str]:
        for node in _rotations(work, which):
            for name, value in values.items():
                set_attr(node, name, value)
        return (places or _gqa_places)(work)
    return edit


def gqa_attrs(**values):
    """Attributes of every GroupQueryAttention set (None removes one)."""
    def edit(work: Work) -> list[str]:
        for gqa in nodes_of(work.graph, "GroupQueryAttention"):
            for name, value in values.items():
                set_attr(gqa, name, value)
        return _gqa_places(work)
    return edit


def q_four_d(work: Work) -> list[str]:
    """The q rotations rotate ``[B, 4, S, 32]`` (Reshape + Transpose before, the inverse after), ``num_heads=7``
    (MRotaryEmbedding takes N from a 4D input)."""
    for node in _rotations(work, "q_rotary"):
        x, y = node.inputs[0], node.outputs[0]
        readers = list(y.uses())
        chain = Chain(work.graph, "four_d")
        x4 = chain.op("Transpose", chain.op("Reshape", x, chain.i64(0, 0, 4, 32)), perm=[0, 2, 1, 3],
                      shape=ir.Shape(["batch_size", 4, "sequence_length", 32]))
        chain.insert([node])
        node.replace_input_with(0, x4)
        y.shape = x4.shape
        back = Chain(work.graph, "four_d_back")
        y3 = back.op("Reshape", back.op("Transpose", y, perm=[0, 2, 1, 3]), back.i64(0, 0, 128), shape=x.shape)
        back.insert([u for u, _ in readers])
        for user, index in readers:
            user.replace_input_with(index, y3)
        set_attr(node, "num_heads", 7)
    work.graph.sort()
    return _gqa_places(work)


def positions_int32_round_trip(work: Work) -> list[str]:
    """The rotations read Cast<int64>(Cast<int32>(position_ids)): equal for positions below 2^31."""
    pos = graph_input(work.graph, "position_ids")
    splice(work.graph, pos, lambda c, v: c.op("Cast", c.op("Cast", v, dtype=ir.DataType.INT32, to=ir.DataType.INT32),
                                              dtype=ir.DataType.INT64, to=ir.DataType.INT64, shape=v.shape),
           "positions", keep=lambda u: u.op_type == "MRotaryEmbedding")
    return _gqa_places(work)


def positions_input_is_output(work: Work) -> list[str]:
    """position_ids (which the fold removes when nothing reads it) is also a graph output."""
    work.graph.outputs.append(graph_input(work.graph, "position_ids"))
    return _gqa_places(work)


def name_taken(name: str, places):
    """A node output of the mutant is already named ``name`` (a name the pass gives what it adds): Identity of
    input_ids read by nothing but a graph output."""
    def edit(work: Work) -> list[str]:
        chain = Chain(work.graph, "name")
        out = chain.op("Identity", graph_input(work.graph, "input_ids"))
        chain.insert([])
        out.name = name
        work.graph.outputs.append(out)
        return places(work)
    return edit


def unnamed_nodes(op_types: tuple[str, ...], places):
    """Every node of ``op_types`` unnamed (ONNX allows it)."""
    def edit(work: Work) -> list[str]:
        for node in work.graph:
            if node.op_type in op_types:
                node.name = ""
        return places(work)
    return edit


# ------------------------------------------------------------------------------------------------------------
# total-seq-on-gpu: the old chain, read elsewhere; its constants in other forms
# ------------------------------------------------------------------------------------------------------------
TOTAL = "total-seq-on-gpu"
LLAMA = "genai/current/llama/cpu_fp32"
SUB = "/model/attn_mask_reformat/attn_mask_subgraph"


def _total_places(work: Work) -> list[str]:
    gqas = nodes_of(work.graph, "GroupQueryAttention")
    return [n.name for n in gqas] + sorted({n.inputs[6].name for n in gqas})


def old_total_output(direct: bool):
    """The old total_sequence_length (int32 Cast of Gather(Shape(mask), 1)) is also a graph output (``direct``: that
    value itself, else through an Identity)."""
    def edit(work: Work) -> list[str]:
        gqa = nodes_of(work.graph, "GroupQueryAttention")[0]
        as_graph_output(work.graph, gqa.inputs[6], None if direct else "mutant_total")
        return _total_places(work)
    return edit


def old_seqlens_in_if(work: Work) -> list[str]:
    """The old seqlens_k is also read inside an If body."""
    gqa = nodes_of(work.graph, "GroupQueryAttention")[0]
    chain = Chain(work.graph, "seqlens_float")
    as_float = chain.op("Cast", gqa.inputs[5], dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT)
    chain.insert([])
    read_in_if(work.graph, as_float, "mutant_seqlens_sum")
    return _total_places(work)


def constant_node(node: str, index: int, attrs: dict, dtype: ir.DataType, shape: list[int]):
    """The chain's ``node`` input ``index`` becomes a ``Constant`` node with ``attrs`` (value_int, value_ints...)."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        const = ir.node("Constant", [], attributes=attrs, name=f"/mutant/constant/{node}")
        const.outputs[0].name = f"/mutant/constant/{node}/output_0"
        const.outputs[0].dtype = dtype
        const.outputs[0].shape = ir.Shape(shape)
        work.graph.insert_before(n, const)
        n.replace_input_with(index, const.outputs[0])
        return _total_places(work)
    return edit


def cast_of_constant(node: str, index: int, value: np.ndarray):
    """The chain's ``node`` input ``index`` becomes ``Cast<int64>(float constant)``."""
    def edit(work: Work) -> list[str]:
        n = node_named(work.graph, f"{SUB}/{node}")
        chain = Chain(work.graph, "cast_const")
        cast = chain.op("Cast", chain.const(value.astype(np.float32)), dtype=ir.DataType.INT64, to=ir.DataType.INT64)
        chain.insert([n])
        n.replace_input_with(index, cast)
        return _total_places(work)
    return edit


# ------------------------------------------------------------------------------------------------------------
# longrope-concat: the switch's threshold and tables in other forms; the If's outputs read elsewhere
# ------------------------------------------------------------------------------------------------------------
LONGROPE = "longrope-concat"
PHI3 = "genai/current/phi3_mini_128k/cpu_fp32"


def _switch(work: Work) -> tuple[ir.Node, ir.Node]:
    (if_node,) = nodes_of(work.graph, "If")
    greater = if_node.inputs[0].producer()
    assert greater is not None and greater.op_type == "Greater"
    return if_node, greater


def threshold_as(build):
    """Greater(total, ``build(chain)``): the threshold in another form."""
    def edit(work: Work) -> list[str]:
        if_node, greater = _switch(work)
        chain = Chain(work.graph, "threshold")
        value = build(chain)
        chain.insert([greater])
        greater.replace_input_with(1, value)
        work.graph.sort()
        return [if_node.name]
    return edit


def _value_int(k: int):
    return lambda c: c.op("Constant", dtype=ir.DataType.INT64, shape=ir.Shape([]), value_int=k)


def _cast_float(k: int):
    return lambda c: c.op("Cast", c.scalar(float(k), np.float32), dtype=ir.DataType.INT64, to=ir.DataType.INT64)


def _gather_concat(k: int):
    def build(c: Chain) -> ir.Value:
        both = c.op("Concat", c.i64(7), c.op("Constant", dtype=ir.DataType.INT64, value_ints=[k]), axis=0)
        return c.op("Gather", both, c.scalar(1), dtype=ir.DataType.INT64, axis=0)
    return build


def _identity_chain(k: int):
    def build(c: Chain) -> ir.Value:
        v = c.i64(k)
        for _ in range(3):
            v = c.op("Identity", v)
        return v
    return build


def _overridable(k: int):
    def build(c: Chain) -> ir.Value:
        value = c.i64(k)
        c.graph.inputs.append(value)
        return value
    return build


def branch_tables_outer(overridable: bool):
    """Each branch returns ``Identity`` of an initializer of the main graph (outer-scope references) instead of its
    own Constant nodes; ``overridable``: those initializers are also graph inputs (a caller may feed other tables)."""
    def edit(work: Work) -> list[str]:
        if_node, _ = _switch(work)
        for key in ("then_branch", "else_branch"):
            branch = if_node.attributes[key].value
            for k, out in enumerate(list(branch.outputs)):
                producer = out.producer()
                array = np.array(producer.attributes["value"].value.numpy())
                outer = Chain(work.graph, f"tables_{key}").const(array)
                if overridable:
                    work.graph.inputs.append(outer)
                ident = ir.node("Identity", [outer], name=f"/mutant/{key}/Identity_{k}")
                ident.outputs[0].name = f"/mutant/{key}/table_{k}"
                ident.outputs[0].dtype, ident.outputs[0].shape = out.dtype, out.shape
                branch.insert_before(producer, ident)
                branch.outputs[k] = ident.outputs[0]
                branch.remove(producer, safe=True)
        return [if_node.name]
    return edit


def if_output_is_graph_output(direct: bool):
    """The If's cos output (the table chosen for this call) is also a graph output: through an Identity, or
    ``direct``ly under its own name ``cos_cache`` (the name the rewrite gives its concatenated table)."""
    def edit(work: Work) -> list[str]:
        if_node, _ = _switch(work)
        as_graph_output(work.graph, if_node.outputs[0], None if direct else "mutant_cos_chosen")
        return [if_node.name]
    return edit


def if_output_read_in_if(work: Work) -> list[str]:
    """The If's cos output is also read inside another If's body (summed to a graph output)."""
    if_node, _ = _switch(work)
    read_in_if(work.graph, if_node.outputs[0], "mutant_cos_chosen_sum")
    return [if_node.name]


# ------------------------------------------------------------------------------------------------------------
# precompute-cos-sin: values of the chain read elsewhere
# ------------------------------------------------------------------------------------------------------------
PRECOMPUTE = "precompute-cos-sin"
TF5 = "torch/tf5/dynamo/llama/decode.onnx"


def _trig(work: Work) -> list[ir.Node]:
    return [n for n in work.graph if n.op_type in ("Cos", "Sin")]


def _precompute_places(work: Work) -> list[str]:
    return [n.name for n in _trig(work)]


def freqs_is_output(work: Work) -> list[str]:
    """The angles (what Cos/Sin read: positions x inv_freq) are also a graph output."""
    cos = next(n for n in _trig(work) if n.op_type == "Cos")
    as_graph_output(work.graph, cos.inputs[0], "mutant_angles")
    return _precompute_places(work)


def cos_read_in_if(work: Work) -> list[str]:
    """The Cos output is also read inside an If body (summed to a graph output)."""
    cos = next(n for n in _trig(work) if n.op_type == "Cos")
    read_in_if(work.graph, cos.outputs[0], "mutant_cos_sum")
    return _precompute_places(work)


def gqa_in_if(places):
    """A copy of layer 0's GroupQueryAttention inside an If body, reading the outer graph's q/k/v, caches and
    lengths: what a pass rewires or removes for the main-graph GQA, the copy still reads."""
    def edit(work: Work) -> list[str]:
        gqa = nodes_of(work.graph, "GroupQueryAttention")[0]
        gqa_copy_in_if(work.graph, gqa, "mutant_attention_in_if")
        return places(work)
    return edit


def shape_slice(start: int | None, end: int | None, index: int):
    """The chain's Shape(mask) gets ``start``/``end`` attributes and its Gather reads element ``index`` of that."""
    def edit(work: Work) -> list[str]:
        shape = node_named(work.graph, f"{SUB}/Shape")
        set_attr(shape, "start", start)
        set_attr(shape, "end", end)
        gather = node_named(work.graph, f"{SUB}/Gather")
        gather.replace_input_with(1, Chain(work.graph, "index").scalar(index))
        return _total_places(work)
    return edit


def _mask_roundtrip(work: Work) -> list[str]:
    mask = graph_input(work.graph, "attention_mask")
    splice(work.graph, mask, lambda c, v: c.op("Cast", c.op("Cast", v, dtype=ir.DataType.FLOAT, to=ir.DataType.FLOAT),
                                               dtype=ir.DataType.INT64, to=ir.DataType.INT64), "mask")
    return _total_places(work)


#: generated builder 0.18 graphs beyond the shared corpus (tests/fixtures, committed): other families
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "genai"


def as_built(places):
    def edit(work: Work) -> list[str]:
        return places(work)
    return edit


def opset(version: int, places):
    """The model's default-domain opset set to ``version``: what the pass builds must exist there."""
    def edit(work: Work) -> list[str]:
        work.model.opset_imports[""] = version
        work.graph.opset_imports[""] = version
        return places(work)
    return edit


def _gather_concat_input(work: Work, node: str, index: int, k: int) -> list[str]:
    n = node_named(work.graph, f"{SUB}/{node}")
    chain = Chain(work.graph, "gather_concat")
    n.replace_input_with(index, _gather_concat(k)(chain))
    chain.insert([n])
    work.graph.sort()
    return _total_places(work)


def mutants() -> list[Mutant]:
    out = []

    def longrope(name, cls, expect, edit, why):
        out.append(Mutant(f"longrope-adv-{name}", cls, LONGROPE, PHI3, expect, edit, why, target="webgpu-graph",
                          reference="offset", calls=LONGROPE_CALLS))

    longrope("threshold-40-value-int", "constant-form", REFUSE, threshold_as(_value_int(40)),
             "Greater(total, Constant(value_int=40)): totals 33..40 would read past the 32-row short table")
    longrope("threshold-40-cast", "constant-form", REFUSE, threshold_as(_cast_float(40)),
             "Greater(total, Cast<int64>(40.0))")
    longrope("threshold-40-gather-concat", "constant-form", REFUSE, threshold_as(_gather_concat(40)),
             "Greater(total, Gather(Concat([7], Constant(value_ints=[40])), 1))")
    longrope("threshold-40-identity-chain", "constant-form", REFUSE, threshold_as(_identity_chain(40)),
             "Greater(total, Identity(Identity(Identity([40]))))")
    longrope("threshold-16-value-int", "constant-form", EQUIVALENT, threshold_as(_value_int(16)),
             "Greater(total, Constant(value_int=16)): offset 16 is exact")
    longrope("threshold-16-gather-concat", "constant-form", EQUIVALENT, threshold_as(_gather_concat(16)),
             "Greater(total, Gather(Concat(...), 1)) = 16: offset 16 is exact")
    longrope("threshold-overridable", "constant-form", REFUSE, threshold_as(_overridable(32)),
             "Greater(total, t), t an initializer that is also a graph input (default 32): a caller may move the "
             "switch, a fixed offset cannot follow")
    longrope("branch-tables-outer", "subgraph", EQUIVALENT, branch_tables_outer(False),
             "the branches return Identity of main-graph initializers (outer-scope references)")
    longrope("branch-tables-overridable", "constant-form", REFUSE, branch_tables_outer(True),
             "the branches return main-graph initializers that are also graph inputs: a caller may feed other tables, "
             "a concatenated copy would freeze the defaults")
    longrope("if-output-is-graph-output", "graph-output", EQUIVALENT, if_output_is_graph_output(False),
             "the If's chosen cos table is also a graph output (its value per call must stay)")
    longrope("if-output-is-graph-output-direct", "graph-output", EQUIVALENT, if_output_is_graph_output(True),
             "the If's output 'cos_cache' is itself a graph output")
    longrope("if-output-read-in-if", "subgraph", EQUIVALENT, if_output_read_in_if,
             "the If's chosen cos table is also read inside another If's body")

    def narrow(name, cls, expect, edit, why):
        out.append(Mutant(f"narrow-legqwen25-{name}", cls, NARROW, LEG_QWEN25, expect, edit, why,
                          target="webgpu-graph", reference="ort", calls=((0, 8, 1), (0, 3, 2), (5, 1, 2))))

    narrow("range-from-2p32", "constant-form", EQUIVALENT, range_from(TWO_32),
           "token index Range(2^32, 2^32 + B*S) - 2^32 after the Reshape: int32 wraps 2^32 + i to i, and the "
           "subtraction then gives i - 2^32")
    narrow("range-from-2p31", "constant-form", EQUIVALENT, range_from(TWO_31),
           "token index Range(2^31, ...) - 2^31: 2^31 + i wraps to a negative int32")
    narrow("range-step-2p20", "constant-form", REFUSE, range_step(1 << 20),
           "token index Range(0, B*S*2^20, 2^20) / 2^20: a prefill of 2048 tokens takes the Reshape past int32")
    narrow("out-and-back-2p32", "position-arithmetic", EQUIVALENT, out_and_back(TWO_32),
           "token index + 2^32 before the Reshape, - 2^32 after it")
    narrow("positions-out-and-back", "position-arithmetic", EQUIVALENT, positions_plus(TWO_32),
           "(position_ids + 2^32) - 2^32: the same positions, a computed detour outside int32")
    narrow("token-index-is-output", "graph-output", EQUIVALENT, token_index_is_output(False),
           "the narrowed Reshape's output is also a graph output (its int64 values must stay)")
    narrow("token-index-is-output-direct", "graph-output", EQUIVALENT, token_index_is_output(True),
           "the narrowed Reshape's output value is itself a graph output (name, int64 type and values must stay)")

    def fold(name, cls, expect, edit, why, base=CUR_QWEN25, reference="plugin", options=None, padded=False):
        short = {CUR_QWEN25: "curqwen25", LEG_QWEN35_TEXT: "legqwen35text", LEG_QWEN25: "legqwen25",
                 CUR_QWEN35: "curqwen35", CUR_QWEN25_FP16: "curqwen25fp16"}[base]
        out.append(Mutant(f"fold-{short}-{name}", cls, FOLD, base, expect, edit, why, target="webgpu",
                          options={"text_only": True} if options is None else options, reference=reference,
                          fp16=base == CUR_QWEN25_FP16, padded=padded))

    fold("interleaved-2", "attribute", EQUIVALENT, rotation_attrs(interleaved=2),
         "MRotaryEmbedding interleaved=2: onnxruntime reads rotate-half (== 1 test)")
    fold("interleaved-1", "attribute", EQUIVALENT, rotation_attrs(interleaved=1), "adjacent pairs")
    fold("scale-half", "attribute", EQUIVALENT, rotation_attrs(scale=0.5), "scale 0.5 on the caches")
    fold("scale-zero", "attribute", EQUIVALENT, rotation_attrs(scale=0.0), "scale 0.0, as onnxruntime reads it")
    fold("q-scale-half-only", "attribute", REFUSE, rotation_attrs("q_rotary", scale=0.5),
         "q's rotation scaled 0.5, k's not: GQA rotates both with one table")
    fold("q-two-heads-rotary-32", "attribute", REFUSE, rotation_attrs("q_rotary", num_heads=2,
                                                                      rotary_embedding_dim=32),
         "q read as 2 heads of 64, the first 32 of each rotated: not GQA's 4 heads of 32 rotated alike")
    fold("rotary-dim-explicit", "attribute", EQUIVALENT, rotation_attrs(rotary_embedding_dim=32),
         "rotary_embedding_dim=32 spelled out (the head size)")
    fold("q-four-d", "dtype-shape", EQUIVALENT, q_four_d, "q rotated as [B, 4, S, 32] with num_heads=7")
    fold("positions-int32-round-trip", "constant-form", EQUIVALENT, positions_int32_round_trip,
         "the rotations read Cast<int64>(Cast<int32>(position_ids))")
    fold("positions-input-is-output", "graph-output", EQUIVALENT, positions_input_is_output,
         "position_ids is also a graph output: the input must stay")
    fold("cache-name-taken", "naming", EQUIVALENT, name_taken("rope_passes.text_mrope.cos_cache", _gqa_places),
         "a value of the graph is already named 'rope_passes.text_mrope.cos_cache' (the fold's table name)")
    fold("unnamed-nodes", "naming", EQUIVALENT,
         unnamed_nodes(("MRotaryEmbedding", "GroupQueryAttention"), lambda w: ["GroupQueryAttention", ""]),
         "the rotations and the GQA nodes are unnamed")
    fold("rotated-q-is-output", "graph-output", EQUIVALENT, rotated_q_output(False),
         "layer 0's rotated q is also a graph output: the fold must keep computing it")
    fold("rotated-q-is-output-direct", "graph-output", EQUIVALENT, rotated_q_output(True),
         "layer 0's rotation output value is itself a graph output")
    fold("positions-read-in-if", "subgraph", EQUIVALENT, positions_read_in_if(),
         "position_ids (cast to float) is also read inside an If body: the input must stay")
    fold("positions-input-read-in-if", "subgraph", EQUIVALENT, positions_read_directly_in_if,
         "position_ids itself is read inside an If body: the input must stay")
    fold("cos-per-token-is-output", "graph-output", EQUIVALENT, cos_table_output,
         "the per-token cos the fold removes is also a graph output", base=LEG_QWEN35_TEXT, reference="ort",
         options={})
    fold("positions-input-read-in-if", "subgraph", EQUIVALENT, positions_read_directly_in_if,
         "the 2D position input is also read inside an If body", base=LEG_QWEN35_TEXT, reference="ort", options={})

    def precompute(name, cls, expect, edit, why):
        out.append(Mutant(f"precompute-adv-tf5-{name}", cls, PRECOMPUTE, TF5, expect, edit, why, target="exporter",
                          options={"max_positions": 256}, reference="ort"))

    precompute("angles-is-output", "graph-output", EQUIVALENT, freqs_is_output,
               "the angles Cos/Sin read are also a graph output: the chain feeding them must stay")
    precompute("cos-read-in-if", "subgraph", EQUIVALENT, cos_read_in_if,
               "the Cos output is also read inside an If body")
    precompute("positions-read-in-if", "subgraph", EQUIVALENT, positions_read_in_if(_precompute_places),
               "position_ids is also read inside an If body")

    def total(name, cls, expect, edit, why, padded=False):
        out.append(Mutant(f"totalseq-llama-{name}", cls, TOTAL, LLAMA, expect, edit, why, target="webgpu-graph",
                          reference="ort", padded=padded))

    total("padded-as-built", "mask", EQUIVALENT, _total_places,
          "the builder's chains, called with left-padded masks (no row all ones: the width is not the largest row sum)", padded=True)
    total("padded-mask-float-roundtrip", "mask", EQUIVALENT,
          _mask_roundtrip, "the mask through float and back, left-padded masks", padded=True)
    total("padded-old-seqlens-read-in-if", "subgraph", EQUIVALENT, old_seqlens_in_if,
          "the old seqlens_k also read inside an If body, left-padded masks", padded=True)

    total("name-taken", "naming", EQUIVALENT, name_taken("/rope_passes/total_seq_on_gpu/mask_int32", _total_places),
          "a value of the graph is already named '/rope_passes/total_seq_on_gpu/mask_int32'")
    total("index-gather-concat", "constant-form", EQUIVALENT,
          lambda w: _gather_concat_input(w, "Gather", 1, 1), "Shape(mask)[Gather(Concat([7], [1]), 1)]: dimension 1")
    total("index-gather-concat-0", "constant-form", REFUSE,
          lambda w: _gather_concat_input(w, "Gather", 1, 0), "Shape(mask)[Gather(Concat([7], [0]), 1)]: the batch")
    total("shape-start-1-index-0", "attribute", EQUIVALENT, shape_slice(1, None, 0),
          "total_sequence_length = Shape(mask, start=1)[0]: the width, spelled with Shape's start attribute")
    total("shape-end-1-index-0", "attribute", REFUSE, shape_slice(None, 1, 0),
          "total_sequence_length = Shape(mask, end=1)[0]: the batch")
    total("shape-start-neg1-index-0", "attribute", EQUIVALENT, shape_slice(-1, None, 0),
          "total_sequence_length = Shape(mask, start=-1)[0]: the width")
    total("old-total-is-output", "graph-output", EQUIVALENT, old_total_output(False),
          "the old total_sequence_length is also a graph output")
    total("old-total-is-output-direct", "graph-output", EQUIVALENT, old_total_output(True),
          "the old total_sequence_length value is itself a graph output")
    total("old-seqlens-read-in-if", "subgraph", EQUIVALENT, old_seqlens_in_if,
          "the old seqlens_k is also read inside an If body")
    total("sub-two-value-ints", "constant-form", REFUSE,
          constant_node("Sub", 1, {"value_ints": [2]}, ir.DataType.INT64, [1]),
          "seqlens_k = ReduceSum(mask) - Constant(value_ints=[2])")
    total("sub-two-value-int", "constant-form", REFUSE,
          constant_node("Sub", 1, {"value_int": 2}, ir.DataType.INT64, []),
          "seqlens_k = ReduceSum(mask) - Constant(value_int=2)")
    total("sub-one-value-int", "constant-form", EQUIVALENT,
          constant_node("Sub", 1, {"value_int": 1}, ir.DataType.INT64, []),
          "seqlens_k = ReduceSum(mask) - Constant(value_int=1): the builder's chain")
    total("gather-dim0-value-int", "constant-form", REFUSE,
          constant_node("Gather", 1, {"value_int": 0}, ir.DataType.INT64, []),
          "total_sequence_length = Shape(mask)[Constant(value_int=0)]: the batch")
    total("sub-two-cast", "constant-form", REFUSE, cast_of_constant("Sub", 1, np.array([2.0])),
          "seqlens_k = ReduceSum(mask) - Cast<int64>(2.0)")
    total("gather-dim0-cast", "constant-form", REFUSE, cast_of_constant("Gather", 1, np.array(0.0)),
          "total_sequence_length = Shape(mask)[Cast<int64>(0.0)]: the batch")
    fold("gqa-copy-in-if", "subgraph", EQUIVALENT, gqa_in_if(_gqa_places),
         "a copy of layer 0's GQA inside an If body reads the rotated q/k and the positions' GQA inputs")
    total("gqa-copy-in-if", "subgraph", EQUIVALENT, gqa_in_if(_total_places),
          "a copy of layer 0's GQA inside an If body reads the old seqlens_k / total_sequence_length")
    longrope("gqa-copy-in-if", "subgraph", EQUIVALENT,
             gqa_in_if(lambda w: [n.name for n in w.graph if n.op_type == "If" and "rope_caches" in n.name]),
             "a copy of layer 0's GQA inside an If body reads the LongRoPE If's cos/sin")
    out.append(Mutant("lower-qwen25-gqa-copy-in-if", "subgraph", "lower-mrope", CUR_QWEN25, EQUIVALENT,
                      gqa_in_if(lambda w: [n.name for n in w.graph if n.op_type == "MRotaryEmbedding"]),
                      "a copy of layer 0's GQA inside an If body reads the rotated q/k", target="webgpu",
                      reference="plugin", vision=True))
    fold("gqa-copy-in-if", "subgraph", EQUIVALENT, gqa_in_if(_gqa_places),
         "builder 0.15 manual mRoPE: a copy of layer 0's GQA inside an If body reads the rotated q/k",
         base=LEG_QWEN25, reference="ort")
    fold("positions-input-read-in-if", "subgraph", EQUIVALENT, positions_read_directly_in_if,
         "builder 0.15 manual mRoPE: the [3, B, S] position input is also read inside an If body", base=LEG_QWEN25,
         reference="ort")
    fold("gqa-copy-in-if", "subgraph", EQUIVALENT, gqa_in_if(_gqa_places),
         "the proven-text form: a copy of layer 0's GQA inside an If body reads the rotated q/k", base=LEG_QWEN35_TEXT,
         reference="ort", options={})
    fold("interleaved-1", "attribute", EQUIVALENT, rotation_attrs(interleaved=1),
         "partial rotary (16 of 32) with adjacent pairs and the interleaved section layout", base=CUR_QWEN35)
    fold("scale-half", "attribute", EQUIVALENT, rotation_attrs(scale=0.5), "partial rotary, scale 0.5",
         base=CUR_QWEN35)
    fold("as-built", "dtype-shape", EQUIVALENT, lambda w: _gqa_places(w),
         "fp16 model: the float rotation between two Casts, folded into an fp16 GQA", base=CUR_QWEN25_FP16)
    fold("scale-half", "dtype-shape", EQUIVALENT, rotation_attrs(scale=0.5),
         "fp16 model, scale 0.5 on the float caches", base=CUR_QWEN25_FP16)
    fold("gqa-rotary-interleaved-preset", "attribute", EQUIVALENT, gqa_attrs(rotary_interleaved=1),
         "the GQA (do_rotary=0) already says rotary_interleaved=1, the rotation is rotate-half: the fold must set 0")
    fold("gqa-do-rotary-2", "attribute", EQUIVALENT, gqa_attrs(do_rotary=2),
         "the GQA says do_rotary=2, which onnxruntime reads as no rotation (== 1 test)")
    out.append(Mutant("narrow-curqwen25-after-lower", "harmless", NARROW, CUR_QWEN25, EQUIVALENT, _narrow_places,
                      "webgpu-graph without --text-only: lower-mrope's position plumbing (Gather/Transpose/Reshape of "
                      "position_ids, the token index) is what narrow-int64 narrows; image positions",
                      target="webgpu-graph", reference="plugin", vision=True))
    out.append(Mutant("narrow-curqwen35-after-lower", "harmless", NARROW, CUR_QWEN35, EQUIVALENT, _narrow_places,
                      "the same on Qwen3.5 (partial rotary, interleaved section layout)", target="webgpu-graph",
                      reference="plugin", vision=True))
    fold("padded-as-built", "mask", EQUIVALENT, _gqa_places,
         "left-padded masks after a past, positions numbered per row as genai does: GQA derives each token's position "
         "from seqlens_k, the rotation read position_ids", padded=True)
    fold("padded-as-built", "mask", EQUIVALENT, _gqa_places, "the same on the proven-text manual form",
         base=LEG_QWEN35_TEXT, reference="ort", options={}, padded=True)
    total("opset-13", "dtype-shape", EQUIVALENT, opset(13, _total_places),
          "default-domain opset 13: the new int32 chain must be opset-13 ops")
    fold("opset-13", "dtype-shape", EQUIVALENT, opset(13, _gqa_places), "default-domain opset 13")
    out.append(Mutant("unfuse-qwen3-opset-13", "dtype-shape", "unfuse-gqa-qk-norm", "genai/current/qwen3/webgpu_fp16",
                      EQUIVALENT, opset(13, _gqa_places), "default-domain opset 13: Split/Reshape as opset 13 has them",
                      target="webgpu", reference="qknorm-oracle", fp16=True))
    fold("layer0-scale-half", "attribute", EQUIVALENT, rotation_attrs("layers.0/", scale=0.5),
         "layer 0's rotations scaled 0.5, layer 1's not: one cache, two tables (shared tables must key on the scale)")
    fold("layer1-interleaved", "attribute", EQUIVALENT, rotation_attrs("layers.1/", interleaved=1),
         "layer 1 rotates adjacent pairs, layer 0 rotate-half: each GQA its own pairing")
    # -- other families (tests/fixtures): as built, with image positions / left-padded masks ------------------
    qwen3vl, qwen3vl16 = str(FIXTURES / "qwen3_vl/cpu_fp32"), str(FIXTURES / "qwen3_vl/webgpu_fp16")
    rotations = lambda w: [n.name for n in w.graph if n.op_type == "MRotaryEmbedding"]  # noqa: E731
    out += [
        Mutant("lower-qwen3vl-as-built", "harmless", "lower-mrope", qwen3vl, EQUIVALENT, as_built(rotations),
               "Qwen3-VL (q/k-norm before the rotation, interleaved section layout), image positions",
               target="webgpu", reference="plugin", vision=True),
        Mutant("lower-qwen3vl-interleaved-2", "attribute", "lower-mrope", qwen3vl, EQUIVALENT,
               rotation_attrs(places=rotations, interleaved=2), "Qwen3-VL with interleaved=2 (rotate-half as onnxruntime reads it)",
               target="webgpu", reference="plugin", vision=True),
        Mutant("fold-qwen3vl-as-built", "harmless", FOLD, qwen3vl, EQUIVALENT, as_built(_gqa_places),
               "Qwen3-VL, --text-only", target="webgpu", options={"text_only": True}, reference="plugin"),
        Mutant("fold-qwen3vlfp16-as-built", "dtype-shape", FOLD, qwen3vl16, EQUIVALENT, as_built(_gqa_places),
               "Qwen3-VL fp16 (float rotation cast to float16 for the GQA), --text-only", target="webgpu",
               options={"text_only": True}, reference="plugin", fp16=True),
        Mutant("fold-qwen3vl-padded", "mask", FOLD, qwen3vl, EQUIVALENT, as_built(_gqa_places),
               "Qwen3-VL, --text-only, left-padded masks with per-row positions", target="webgpu",
               options={"text_only": True}, reference="plugin", padded=True),
    ]
    for family in ("gemma", "phi2"):
        out.append(Mutant(f"totalseq-{family}-padded-as-built", "mask", TOTAL, str(FIXTURES / family / "webgpu_fp32"),
                          EQUIVALENT, as_built(_total_places), f"{family} (builder 0.18), left-padded masks",
                          target="webgpu-graph", reference="ort", padded=True))
    return out
