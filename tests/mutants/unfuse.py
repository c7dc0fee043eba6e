"""Mutants attacking ``unfuse-gqa-qk-norm``: GroupQueryAttention's fused q/k RMSNorm (inputs 14/15,
``qk_norm_epsilon``) read differently than onnxruntime reads it.

Base: the builder 0.18 Qwen3 fp16 graph (``current/qwen3/webgpu_fp16``: separate q/k/v, q/k-norm weights ``[32]``).
Reference: the mutant with its fused norms lowered by the test's own definition (:mod:`.qknorm`,
``reference="qknorm-oracle"``: onnxruntime >= 1.31 runs the fused form on its WebGPU plugin EP only, and
``tests/test_mutants.py`` checks the lowering against it), on onnxruntime 1.27 CPU like the candidate.
Tolerance: fp16. onnxruntime requires both weights and do_rotary=1 with them (else an error): the mutants that
break either must be refused (unfusing would turn a graph that loads nowhere into one that runs).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import EQUIVALENT, REFUSE, Mutant, Work
from .edit import Chain, nodes_of
from .probes import as_constant_node, as_graph_output, overridable, read_in_if, set_attr

PASS = "unfuse-gqa-qk-norm"
QWEN3 = "genai/current/qwen3/webgpu_fp16"
Q_NORM, K_NORM = 14, 15


def _gqas(work: Work) -> list[ir.Node]:
    return nodes_of(work.graph, "GroupQueryAttention")


def _places(work: Work) -> list[str]:
    return [n.name for n in _gqas(work)]


def as_built(work: Work) -> list[str]:
    return _places(work)


def gqa_attrs(**values):
    def edit(work: Work) -> list[str]:
        for gqa in _gqas(work):
            for name, value in values.items():
                set_attr(gqa, name, value)
        return _places(work)
    return edit


def _scale_input(work: Work, index: int, factor: float) -> None:
    """GQA input ``index`` (q or k) multiplied by ``factor`` first: small values, where epsilon is not negligible."""
    for gqa in _gqas(work):
        value = gqa.inputs[index]
        chain = Chain(work.graph, "small")
        small = chain.op("Mul", value, chain.scalar(factor, np.float16), shape=value.shape)
        chain.insert([gqa])
        gqa.replace_input_with(index, small)


def small_q_k(**epsilon):
    """q and k scaled by 1e-3 (mean square ~1e-7), then ``qk_norm_epsilon`` set (None: removed)."""
    def edit(work: Work) -> list[str]:
        _scale_input(work, 0, 1e-3)
        _scale_input(work, 1, 1e-3)
        return gqa_attrs(**epsilon)(work)
    return edit


def weights(transform):
    """``transform(graph, weight)`` on every q/k-norm weight initializer."""
    def edit(work: Work) -> list[str]:
        for gqa in _gqas(work):
            for index in (Q_NORM, K_NORM):
                value = gqa.inputs[index]
                if value is not None and value.is_initializer():
                    transform(work.graph, value)
        return _places(work)
    return edit


def _reshaped(graph: ir.Graph, weight: ir.Value) -> None:
    """The weight stored as ``[1, head]``: not the 1-D vector the contract names."""
    array = weight.const_value.numpy()
    weight.const_value = ir.tensor(array.reshape(1, -1), name=weight.name)
    weight.shape = ir.Shape([1, array.shape[0]])


def shared_weight(work: Work) -> list[str]:
    """Every GQA's q-norm and k-norm read one weight (layer 0's q-norm): four readers of one initializer."""
    first = _gqas(work)[0].inputs[Q_NORM]
    for gqa in _gqas(work):
        for index in (Q_NORM, K_NORM):
            gqa.replace_input_with(index, first)
    return _places(work)


def pack_qkv(work: Work) -> list[str]:
    """Each GQA reads the packed projection the builder splits (key/value empty): the packed-QKV path."""
    for gqa in _gqas(work):
        split = gqa.inputs[0].producer()
        assert split is not None and split.op_type == "Split"
        gqa.replace_input_with(0, split.inputs[0])
        gqa.replace_input_with(1, None)
        gqa.replace_input_with(2, None)
    return _places(work)


def query_is_output(work: Work) -> list[str]:
    """Layer 0's (unnormalised) q is also a graph output: the unfused norm must not change what it holds."""
    as_graph_output(work.graph, _gqas(work)[0].inputs[0], "mutant_q_raw")
    return _places(work)


def query_read_in_if(work: Work) -> list[str]:
    read_in_if(work.graph, _gqas(work)[0].inputs[0], "mutant_q_sum")
    return _places(work)


def drop_k_norm(work: Work) -> list[str]:
    """The k-norm weight (input 15) removed: a q-norm alone."""
    for gqa in _gqas(work):
        gqa.resize_inputs(K_NORM)  # 15 inputs: no trailing empty one (saving would drop it)
    return _places(work)


def names(new: tuple[str, str]):
    """The two GQA nodes renamed: what the unfused nodes' names derive from."""
    def edit(work: Work) -> list[str]:
        for gqa, name in zip(_gqas(work), new, strict=True):
            gqa.name = name
        return list(new) if all(new) else ["GroupQueryAttention"]  # what the report names an unnamed GQA
    return edit


def mutants() -> list[Mutant]:
    def m(name, cls, expect, edit, why):
        return Mutant(f"unfuse-qwen3-{name}", cls, PASS, QWEN3, expect, edit, why, target="webgpu",
                      reference="qknorm-oracle", fp16=True)

    return [
        m("as-built", "harmless", EQUIVALENT, as_built, "the builder's fused graph: the unfusing's baseline"),
        m("epsilon-absent-small-qk", "attribute", EQUIVALENT, small_q_k(qk_norm_epsilon=None),
          "no qk_norm_epsilon attribute (the kernel's default applies) on q/k of mean square ~1e-7, where the "
          "epsilon is not negligible"),
        m("epsilon-1e-2-small-qk", "attribute", EQUIVALENT, small_q_k(qk_norm_epsilon=1e-2),
          "qk_norm_epsilon 1e-2 on small q/k: the attribute's value must reach the norm"),
        m("packed-qkv", "dtype-shape", EQUIVALENT, pack_qkv, "packed QKV: split, normalised, concatenated back"),
        m("weights-constant-node", "constant-form", EQUIVALENT, weights(as_constant_node),
          "the norm weights as Constant nodes"),
        m("weights-overridable", "constant-form", EQUIVALENT, weights(overridable),
          "the norm weights also graph inputs: the unfused norm must read the same (overridable) value"),
        m("weights-2d", "dtype-shape", REFUSE, weights(_reshaped), "norm weights stored as [1, 32]"),
        m("shared-weight", "graph-output", EQUIVALENT, shared_weight,
          "one weight read as q-norm and k-norm by both layers"),
        m("query-is-output", "graph-output", EQUIVALENT, query_is_output,
          "layer 0's q (before the norm) is also a graph output"),
        m("query-read-in-if", "subgraph", EQUIVALENT, query_read_in_if,
          "layer 0's q (before the norm) is also read inside an If body"),
        m("gqa-same-parent", "naming", EQUIVALENT, names(("/attn/GroupQueryAttention", "/attn/GroupQueryAttention_1")),
          "both GQA nodes under one name prefix (the unfused nodes' names derive from it)"),
        m("gqa-unnamed", "naming", EQUIVALENT, names(("", "")), "both GQA nodes unnamed"),
        m("q-norm-only", "attribute", REFUSE, drop_k_norm,
          "a q-norm weight without a k-norm weight (onnxruntime rejects it: the input loads nowhere)"),
        m("do-rotary-0", "attribute", REFUSE, gqa_attrs(do_rotary=0),
          "q/k-norm weights with do_rotary=0 (onnxruntime rejects it: the norm would follow an outside rotation)"),
    ]
