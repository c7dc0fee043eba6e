"""``rope_passes.runtime.rows.RowEvaluator``: the fold's fast table is the whole cone's table, bit for bit, and a
wrong fast table can never become the fold's table.

The fast evaluator moves data in NumPy, defers elementwise ops to the elements that reach the output and computes
every number with onnxruntime's own kernels; the reference is the whole cone run on onnxruntime CPU
(``subgraph_runner``), the path the fold used before. Equality is exact (``assert_array_equal``): the claim is the
same kernels on the same element values, not a tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GENAI
from mrope_graphs import attention_graph

from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.io import load_bundle
from rope_passes.proofs import mrope_cone as _mrope_cone
from rope_passes.proofs.mrope_cone import evaluate_tables, manual_cone
from rope_passes.runtime.evaluate import subgraph_runner
from rope_passes.runtime.rows import RowEvaluator, Unsupported


def _cone(model, rows=None):
    rope = nodes_of(model, "RotaryEmbedding", MS_DOMAIN)[0]
    return manual_cone(model, rope, rows, "position_ids")


def _both(model, cone):
    inputs, outputs = [cone.positions.graph_input], [cone.cos, cone.sin]
    return subgraph_runner(model, inputs, outputs), RowEvaluator(model, inputs, outputs)


def _counting(fn, calls):
    def wrapped(feeds):
        calls.append(1)
        return fn(feeds)
    return wrapped


def _assert_same_tables(model, cone):
    run, fast = _both(model, cone)
    calls: list[int] = []
    got = evaluate_tables(cone, run, _counting(fast, calls))
    want = evaluate_tables(cone, run)
    assert calls, "the fast evaluator was not used"
    np.testing.assert_array_equal(got.cos, want.cos)
    np.testing.assert_array_equal(got.sin, want.sin)
    # and the whole table in one call on each side (not only chunk by chunk)
    p = np.arange(cone.rows)[None, :]
    feed = np.stack([p, p, p]) if len(cone.positions.graph_input.shape) == 3 else p
    for a, b in zip(fast([feed]), run([feed]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("sections", "layout", "rotary_dim", "dtype", "positions"), [
    ([16, 24, 24], 0, None, "float32", "3d"),
    ([16, 24, 24], 0, None, "float32", "tiled"),
    ([24, 20, 20], 1, None, "float16", "3d"),
    ([8, 12, 12], 0, 64, "float32", "3d"),
])
def test_small_manual_forms(sections, layout, rotary_dim, dtype, positions):
    model = attention_graph(form="manual", sections=sections, layout=layout, rotary_dim=rotary_dim, dtype=dtype,
                            positions=positions, max_pos=_mrope_cone.CHUNK + 37)
    _assert_same_tables(model, _cone(model))


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["legacy/qwen25_vl/cpu_fp32", "legacy/qwen25_vl/webgpu_fp16_graph",
                                  "legacy/qwen35/cpu_fp32", "legacy/qwen35/webgpu_fp16_graph_text"])
def test_corpus_cones(name):
    """The builder 0.15.2 forms: Qwen2.5-VL inv_freq → MatMul → Cos/Sin → Split/Gather/Concat (a table computed
    over the context length), Qwen3.5 cache Gather + h/w Where masks."""
    bundle = load_bundle(GENAI / name)
    _assert_same_tables(bundle.model, _cone(bundle.model, bundle.genai_config.context_length))


def test_a_wrong_fast_table_is_never_used():
    """A fast evaluator whose rows are off by one position: the probes (whole cone on onnxruntime) disagree, the
    table is built on the whole cone, and that is the table the fold gets."""
    model = attention_graph(form="manual", sections=[16, 24, 24], positions="3d", max_pos=300)
    cone = _cone(model)
    run, fast = _both(model, cone)

    def shifted(feeds):
        return fast([feeds[0] + 1])

    got = evaluate_tables(cone, run, shifted)
    want = evaluate_tables(cone, run)
    np.testing.assert_array_equal(got.cos, want.cos)
    np.testing.assert_array_equal(got.sin, want.sin)
    p = np.arange(299)[None]
    assert not np.array_equal(shifted([np.stack([p, p, p])])[0], want.cos[:299])  # it was wrong indeed


def test_a_failing_fast_evaluator_falls_back():
    model = attention_graph(form="manual", sections=[16, 24, 24], positions="3d", max_pos=100)
    cone = _cone(model)
    run, _ = _both(model, cone)

    def broken(feeds):
        raise Unsupported("test")

    got = evaluate_tables(cone, run, broken)
    np.testing.assert_array_equal(got.cos, evaluate_tables(cone, run).cos)


def test_other_graph_inputs_are_unsupported():
    """A cone reading a graph input other than the positions is not evaluated by it (the static proof refuses those
    first; the evaluator does not guess a value)."""
    model = attention_graph(form="manual", sections=[16, 24, 24], positions="3d", max_pos=64)
    cone = _cone(model)
    with pytest.raises(Unsupported):
        RowEvaluator(model, [], [cone.cos])
