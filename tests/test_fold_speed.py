"""``fold-text-mrope`` at real context sizes (issue 14): the work grows with the distinct cos/sin cones, not with the
layers or the q/k rotations.

The builder 0.15.2 Qwen2.5-VL graph gives every layer its own copy of the cos/sin subgraph; the fold compares the
copies structurally, proves and evaluates each distinct one once (``FoldTextMRoPEPass.evaluations``) and keeps one
table per distinct cone, so the q and k of every layer read the same two GQA caches. Graphs: ``bench/realsize.py``'s
real-size Qwen2.5-VL-7B layer block (hidden 3584, 28 heads, head 128, sections [16, 24, 24]) at a few layers and a
4096-row context (CI-sized: seconds; the 28-layer, 128000-row model is the benchmark, docs/passes/fold-text-mrope.md).
"""

from __future__ import annotations

import time

import numpy as np
import onnx_ir as ir
import pytest
from _utils import realsize
from conftest import GENAI

from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.io import load_bundle
from rope_passes.passes import FoldTextMRoPEPass, PassContext
from rope_passes.proofs.mrope_cone import CHUNK

pytestmark = pytest.mark.corpus  # bench/realsize.py scales the corpus's tiny builder graphs
CONTEXT = 4096




def _build(tmp_path, layers: int):
    folder = realsize().build("qwen25vl-7b-legacy", tmp_path / f"legacy{layers}", layers=layers, context=CONTEXT,
                               corpus=GENAI)
    return load_bundle(folder)


def _fold(bundle) -> tuple[FoldTextMRoPEPass, object]:
    fold = FoldTextMRoPEPass(PassContext(bundle.genai_config), text_only=True)
    return fold, fold(bundle.model)


def _gqa_caches(model: ir.Model) -> set[tuple[str, str]]:
    return {(g.inputs[7].name, g.inputs[8].name) for g in nodes_of(model, "GroupQueryAttention", MS_DOMAIN)}


@pytest.mark.parametrize("layers", [2, 6])
def test_one_evaluation_and_one_table_for_all_layers(tmp_path, layers):
    bundle = _build(tmp_path, layers)
    assert len(nodes_of(bundle.model, "RotaryEmbedding", MS_DOMAIN)) == 2 * layers
    start = time.perf_counter()
    fold, result = _fold(bundle)
    seconds = time.perf_counter() - start
    assert result.report.status == f"rewritten {layers}", result.report.status
    assert fold.evaluations == 1  # one distinct cone, however many layers copy it
    (caches,) = _gqa_caches(bundle.model)  # q and k of every layer read one pair
    cos = bundle.model.graph.initializers[caches[0]].const_value.numpy()
    assert cos.shape == (CONTEXT, 64) and cos.dtype == np.float16
    assert seconds < 60, seconds  # seconds here; a generous bound for a loaded CI machine


def test_evaluations_count_distinct_cones(tmp_path):
    """Layer 0's cone with its own inv_freq (halved): two distinct cones, two evaluations, two cache pairs; the other
    layers still share one."""
    bundle = _build(tmp_path, 4)
    graph = bundle.model.graph
    unsq = next(n for n in graph if n.name == "/model/layers.0/attn/mrope_dynamic_cache/inv_freq/Unsqueeze")
    inv = unsq.inputs[0]
    halved = ir.Value(name=f"{inv.name}_layer0", shape=inv.shape, type=inv.type)
    halved.const_value = ir.tensor(inv.const_value.numpy() * np.float32(0.5), name=halved.name)
    graph.register_initializer(halved)
    unsq.replace_input_with(0, halved)
    fold, result = _fold(bundle)
    assert result.report.status == "rewritten 4", result.report.status
    assert fold.evaluations == 2
    caches = [(g.name, g.inputs[7].name) for g in nodes_of(bundle.model, "GroupQueryAttention", MS_DOMAIN)]
    assert len({c for _, c in caches}) == 2
    assert len({c for name, c in caches if "layers.0/" not in name}) == 1


def test_refusal_before_numbers(tmp_path):
    """Without --text-only the [3, B, S] input is refused before any table is evaluated."""
    bundle = _build(tmp_path, 2)
    fold = FoldTextMRoPEPass(PassContext(bundle.genai_config))
    result = fold(bundle.model)
    assert not result.modified and result.report.count(result.report.findings[0].outcome) == 2
    assert "--text-only" in result.report.status and fold.evaluations == 0


def test_table_is_built_in_chunks_and_equals_one_call():
    """The chunked table (memory bounded by CHUNK rows) equals the table of one call over all positions."""
    from mrope_graphs import attention_graph

    from rope_passes.proofs.mrope_cone import evaluate_tables, manual_cone
    from rope_passes.runtime.evaluate import subgraph_runner

    rows = CHUNK + 100
    model = attention_graph(form="manual", sections=[16, 24, 24], positions="3d", max_pos=rows)
    rope = nodes_of(model, "RotaryEmbedding", MS_DOMAIN)[0]
    cone = manual_cone(model, rope, None, "position_ids")
    assert cone.rows == rows
    run = subgraph_runner(model, [cone.positions.graph_input], [cone.cos, cone.sin])
    tables = evaluate_tables(cone, run)
    whole = np.tile(np.arange(rows, dtype=np.int64)[None, None], (3, 1, 1))
    cos, sin = run([whole])
    np.testing.assert_array_equal(tables.cos, cos)
    np.testing.assert_array_equal(tables.sin, sin)
