"""The pipeline's own work (issue 17): one capture verdict per graph state, a roll-back snapshot only for a state no
snapshot holds yet, and roll-backs that still restore exactly the graph before the refused pass.

What is counted here is work (calls), never time: timing belongs in ``bench/run_all``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest

import rope_passes
import rope_passes.analysis.placement as placement
import rope_passes.analysis.placement.predict as predict
import rope_passes.passes.narrow_int64 as narrow_int64
from rope_passes.analysis.placement import capture_verdict
from rope_passes.demo import build_tiny_decoder
from rope_passes.io import load_bundle
from rope_passes.passes import ALL_PASSES, PassContext, RopePass
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import make_plan
from rope_passes.report import PassReport
from rope_passes.runtimes.descriptors import WEBGPU_127
from rope_passes.runtimes.probed import probed_runtime


class _AddsACpuNode(RopePass):
    """Puts an int64 ``Mul`` (no WebGPU kernel in 1.27) before the embedding Gather: one more CPU node, so the
    pipeline must refuse it and roll it back. It also writes the config."""

    name = "test-work-adds-cpu-node"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        ids = model.graph.inputs[0]  # input_ids, int64, read by the embedding Gather
        gather = next(n for n in model.graph if n.op_type == "Gather" and n.inputs[1] is ids)
        one = ir.Value(name=f"one_{len(model.graph)}", const_value=ir.tensor(np.array(1, np.int64)))
        model.graph.register_initializer(one)
        mul = ir.node("Mul", [ids, one], name="test/Mul")
        model.graph.insert_before(gather, mul)
        gather.replace_input_with(1, mul.outputs[0])
        report.rewritten("test/Mul", "multiplied input_ids by 1 on CPU")
        if self.genai_config.present:
            report.genai_config_changes.append(self.genai_config.set_provider_option("webgpu", "x", "1") or "")


@pytest.fixture
def tiny(tmp_path):
    return build_tiny_decoder(tmp_path / "demo")


def _count(monkeypatch, module, name) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_one_capture_verdict_per_graph_state(tiny, tmp_path, monkeypatch):
    """optimize --target webgpu-graph on the tiny decoder: the verdict of the input, one after each pass that changed
    the graph (total-seq-on-gpu, cleanup), and nothing more: narrow-int64 and the capture config read the pipeline's
    (before: 5 predictions, the input's, 2 after passes, narrow-int64's own and capture_config's)."""
    calls = _count(monkeypatch, predict, "predict_placement")
    monkeypatch.setattr(narrow_int64, "predict_placement", predict.predict_placement)
    report = rope_passes.optimize(tiny, tmp_path / "out", preset="webgpu-graph", runtime=WEBGPU_127, weights="copy")
    changed = [p.pass_name for p in report.passes if p.modified]
    assert changed == ["total-seq-on-gpu", "cleanup"]
    assert len(calls) == 1 + len(changed)
    # the reused verdict is the output's: the same answer computed afresh on the saved model
    assert report.capture["state"] == capture_verdict(load_bundle(tmp_path / "out").model, WEBGPU_127).state == "ready"
    assert [p.status for p in report.passes if p.pass_name == "narrow-int64"] == [
        "not matched: no Memcpy predicted under graph capture"]


def test_snapshot_only_for_a_new_graph_state(tiny, monkeypatch):
    """A roll-back snapshot is serialized before the first pass and after each pass that changed the graph (the
    output state the validity contract loads, which is the next pass's roll-back point), not before every pass
    (before: one per pass, 8 here)."""
    bundle = load_bundle(tiny)
    calls = _count(monkeypatch, ir.serde, "serialize_model")
    report = run_pipeline(bundle, make_plan(preset="webgpu-graph", runtime=WEBGPU_127))
    assert len(report.passes) == 8
    # the input's state, the state after total-seq-on-gpu (narrow-int64 runs on it), the state after cleanup
    assert [p.pass_name for p in report.passes if p.modified] == ["total-seq-on-gpu", "cleanup"]
    assert len(calls) == 3


def test_roll_back_after_a_pass_that_changed_nothing(tiny, monkeypatch):
    """The refused pass runs after one that changed nothing (its snapshot is the one taken before that pass): the
    roll-back gives the graph after total-seq-on-gpu, not before it, and the config as it was."""
    monkeypatch.setitem(ALL_PASSES, _AddsACpuNode.name, _AddsACpuNode)
    bundle = load_bundle(tiny)
    config = json.dumps(bundle.genai_config.data)
    report = run_pipeline(bundle, make_plan(passes=["total-seq-on-gpu", "narrow-int64", _AddsACpuNode.name], runtime=WEBGPU_127))
    done, nothing, refused = report.passes
    assert done.modified and not nothing.modified and refused.status.startswith("refused: refused for this model")
    assert "test/Mul" not in [n.name for n in bundle.model.graph]
    assert capture_verdict(bundle.model, WEBGPU_127).state == "ready"  # total-seq-on-gpu's work kept
    assert json.dumps(bundle.genai_config.data) == config
    assert report.verdict_of(bundle.model, WEBGPU_127) is not None  # the restored graph's verdict is known


def test_two_roll_backs_in_a_row(tiny, monkeypatch):
    """Each refused pass is rolled back to the graph before it: the second runs on the restored graph (a fresh
    snapshot of it) and is rolled back too; the weights still read from the input's data file."""
    monkeypatch.setitem(ALL_PASSES, _AddsACpuNode.name, _AddsACpuNode)
    bundle = load_bundle(tiny)
    report = run_pipeline(bundle, make_plan(passes=["total-seq-on-gpu", _AddsACpuNode.name, _AddsACpuNode.name], runtime=WEBGPU_127))
    assert [p.status.startswith("refused") for p in report.passes] == [False, True, True]
    assert "test/Mul" not in [n.name for n in bundle.model.graph]
    embed = next(n for n in bundle.model.graph if n.name == "/model/embed_tokens/Gather")
    assert embed.inputs[1] is bundle.model.graph.inputs[0]
    assert capture_verdict(bundle.model, WEBGPU_127).state == "ready"
    assert bundle.model.graph.initializers["model.embed_tokens.weight"].const_value.numpy().shape == (512, 64)


def test_take_verdict_once_and_only_for_its_model(tiny):
    model = load_bundle(tiny).model
    verdict = capture_verdict(model, WEBGPU_127)
    ctx = PassContext(runtime=probed_runtime(WEBGPU_127))
    ctx.verdict = (model, WEBGPU_127, verdict)
    assert ctx.take_verdict(load_bundle(tiny).model, WEBGPU_127) is None  # another model object
    ctx.verdict = (model, WEBGPU_127, verdict)
    assert ctx.take_verdict(model, "onnxruntime-ep-webgpu") is None  # another runtime
    ctx.verdict = (model, WEBGPU_127, verdict)
    assert ctx.take_verdict(model, WEBGPU_127) is verdict
    assert ctx.take_verdict(model, WEBGPU_127) is None  # taken: the pass may have changed the graph since


# ----------------------------------------------------------------------------------------------------------------
# The static placement prediction's own work
# ----------------------------------------------------------------------------------------------------------------


def _chain(order: str) -> ir.Model:
    """x (float) -> Shape -> Cast(float) -> Neg -> y, nodes in graph order (``sorted``) or reversed (each reader before
    its producer: Neg's element type is known only once Cast's is, a later round)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["n"]))
    shape = ir.node("Shape", [x], name="shape")
    cast = ir.node("Cast", [shape.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name="cast")
    neg = ir.node("Neg", [cast.outputs[0]], name="neg")
    nodes = [shape, cast, neg] if order == "sorted" else [neg, cast, shape]
    graph = ir.Graph([x], [neg.outputs[0]], nodes=nodes, opset_imports={"": 21}, name="g")
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_element_types_on_a_graph_out_of_order(order):
    """One round of type inference where every producer comes before its readers; more where not (the answer is the
    same)."""
    model = _chain(order)
    dtypes = placement.Dtypes(model.graph)
    neg = next(n for n in model.graph if n.name == "neg")
    shape = next(n for n in model.graph if n.name == "shape")
    assert dtypes(shape.outputs[0]) == "INT64" and dtypes(neg.outputs[0]) == "FLOAT"


def test_facts_of_a_graph_computed_once_for_both_predictions(monkeypatch):
    """A graph with a node onnxruntime may fold is placed twice (folded and not); what does not depend on folding
    (element types, common subexpressions, ...) is computed once (before: twice)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["n", 4]))
    shape = ir.node("Shape", [x], name="shape")  # concrete dim read: onnxruntime folds it
    shape.attributes["start"] = ir.AttrInt64("start", 1)
    cast = ir.node("Cast", [shape.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name="cast")
    add = ir.node("Add", [x, cast.outputs[0]], name="add")
    model = ir.Model(ir.Graph([x], [add.outputs[0]], nodes=[shape, cast, add], opset_imports={"": 21}, name="g"),
                     ir_version=10)
    calls = _count(monkeypatch, predict, "Dtypes")
    verdict = placement.capture_verdict(model, WEBGPU_127)
    assert "shape" in verdict.maybe_folded  # so both predictions ran
    assert len(calls) == 1


# ----------------------------------------------------------------------------------------------------------------
# The command line's process
# ----------------------------------------------------------------------------------------------------------------


def test_the_collector_is_tuned_only_when_the_process_is_the_command(monkeypatch, capsys):
    """``rope-passes`` (main() reading sys.argv) sets the cyclic collector for one short process; a caller's
    main([...]) (a test, a script) keeps its own settings."""
    import rope_passes.cli as cli

    tuned: list[int] = []
    monkeypatch.setattr(cli, "tune_gc", lambda: tuned.append(1))
    assert cli.main(["passes"]) == 0 and tuned == []
    monkeypatch.setattr("sys.argv", ["rope-passes", "passes"])
    assert cli.main() == 0 and tuned == [1]
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------------------------
# graph_walk: onnx_ir's order at a third of its cost
# ----------------------------------------------------------------------------------------------------------------


def _nested() -> ir.Model:
    """An If whose branches hold nodes, one branch an If of its own (a GRAPH attribute in a GRAPH) and a node with a
    GRAPHS attribute shared by two of its slots (visited twice, entered once)."""
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))

    def branch(tag: str, inner: ir.Graph | None = None) -> ir.Graph:
        nodes = [ir.node("Neg", [x], name=f"{tag}/neg")]
        if inner is not None:
            nodes.append(ir.node("If", [cond], attributes={"then_branch": inner, "else_branch": branch(f"{tag}/e")},
                                 num_outputs=1, name=f"{tag}/if"))
        nodes.append(ir.node("Abs", [nodes[-1].outputs[0]], name=f"{tag}/abs"))
        return ir.Graph([], [nodes[-1].outputs[0]], nodes=nodes, name=tag)

    shared = branch("shared")
    top = [ir.node("Relu", [x], name="relu"),
           ir.node("If", [cond], attributes={"then_branch": branch("then", branch("deep")),
                                             "else_branch": branch("else")}, num_outputs=1, name="if"),
           ir.node("Custom", [x], domain="test", attributes={"bodies": ir.AttrGraphs("bodies", [shared, shared])},
                   name="custom"),
           ir.node("Sigmoid", [x], name="sigmoid")]
    return ir.Model(ir.Graph([cond, x], [top[-1].outputs[0]], nodes=top, opset_imports={"": 21, "test": 1}),
                    ir_version=10)


def test_graph_walk_in_onnx_irs_order():
    from rope_passes import graph_walk

    model = _nested()
    theirs = [n.name for n in ir.traversal.RecursiveGraphIterator(model.graph)]
    assert [n.name for n in graph_walk.nodes(model.graph)] == theirs
    assert len(theirs) == 17 and theirs.count("shared/neg") == 2
    assert [g.name for g in graph_walk.graphs(model)] == [g.name for g in model.graphs()]
    assert [g.name for g in graph_walk.subgraphs(model.graph)] == [g.name for g in model.graph.subgraphs()]
    assert len(list(graph_walk.subgraphs(model.graph))) == 5  # then, deep, then/e, else, shared (once)


# ----------------------------------------------------------------------------------------------------------------
# concat_offset.fit_frequencies: buffers reused, the same bits as the plain formulas
# ----------------------------------------------------------------------------------------------------------------


def _reference_fit(cos, sin, rows, tolerance):
    """fit_frequencies as the plain formulas write it (a fresh array per step)."""
    from rope_passes.proofs.concat_offset import ANGLE_REL, FIT_CHUNK, Fit

    n = len(rows)
    scale = cos[rows.start].astype(np.float64)
    moment = np.zeros(cos.shape[1])
    last = None
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        phase = np.arctan2(sin[rows.start + lo : rows.start + hi].astype(np.float64),
                           cos[rows.start + lo : rows.start + hi].astype(np.float64))
        prev = phase[:1] if last is None else last[None, :]
        step = np.diff(phase, axis=0, prepend=prev)
        step -= (2 * np.pi) * np.round(step / (2 * np.pi))
        phase = prev + np.cumsum(step, axis=0)
        last = phase[-1]
        moment += np.arange(lo, hi, dtype=np.float64) @ phase
    w = moment / max(float((n - 1) * n * (2 * n - 1) / 6), 1.0)
    error = excess = 0.0
    row = 0
    for lo in range(0, n, FIT_CHUNK):
        hi = min(lo + FIT_CHUNK, n)
        angle = np.arange(lo, hi, dtype=np.float64)[:, None] * w
        allowed = tolerance + np.abs(scale) * np.abs(angle) * ANGLE_REL
        err = np.maximum(np.abs(scale * np.cos(angle) - cos[rows.start + lo : rows.start + hi]),
                         np.abs(scale * np.sin(angle) - sin[rows.start + lo : rows.start + hi]))
        ratio = err / allowed
        at = int(np.argmax(ratio))
        error = max(error, float(err.max()))
        if ratio.flat[at] > excess:
            excess, row = float(ratio.flat[at]), lo + at // ratio.shape[1]
    return Fit(w=w, error=error, excess=excess, row=row)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fit_frequencies_same_bits_as_the_plain_formulas(dtype):
    from rope_passes.proofs.concat_offset import FIT_CHUNK, fit_frequencies

    rng = np.random.default_rng(0)
    half, short, rows = 24, 4096, 4096 + 2 * FIT_CHUNK + 123  # a long half over 2 chunks and a piece
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    factors = np.where(np.arange(half) < half // 2, 1.0, rng.uniform(1.0, 8.0, half))
    angles = np.concatenate([np.arange(short)[:, None] * inv, np.arange(rows - short)[:, None] * inv / factors])
    scale = np.where(np.arange(rows)[:, None] < short, 1.0, 1.19)
    cos, sin = (scale * np.cos(angles)).astype(dtype), (scale * np.sin(angles)).astype(dtype)
    noisy_cos = cos.copy()
    noisy_cos[short + 5000, 3] += dtype(0.25)  # one row off: a large excess there
    for c, s in ((cos, sin), (noisy_cos, sin)):
        for span in (range(short), range(short, rows), range(rows), range(7, 8), range(3, 3 + FIT_CHUNK)):
            got, want = fit_frequencies(c, s, span, 2e-3), _reference_fit(c, s, span, 2e-3)
            assert np.array_equal(got.w, want.w) and (got.error, got.excess, got.row) == (
                want.error, want.excess, want.row), (span, got, want)
    assert fit_frequencies(noisy_cos, sin, range(short, rows), 2e-3).excess > 1.0


class _AddsATable(RopePass):
    """Adds an in-memory 16 MB initializer nothing reads (placement unchanged: accepted)."""

    name = "test-work-adds-table"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        table = ir.Value(name="test/table", const_value=ir.tensor(np.arange(4 << 20, dtype=np.float32).reshape(-1, 64)))
        model.graph.register_initializer(table)
        report.rewritten("test/table", "added a table")


def test_snapshot_holds_in_memory_tensors_by_reference(tiny, monkeypatch):
    """A snapshot taken after a pass added a 16 MB table holds the table object, not a copy of its bytes; the
    roll-back of the next pass gives the graph with the same table object and values back."""
    import rope_passes.passes.base as base

    monkeypatch.setitem(ALL_PASSES, _AddsATable.name, _AddsATable)
    monkeypatch.setitem(ALL_PASSES, _AddsACpuNode.name, _AddsACpuNode)
    snapshots: list = []
    real = base.Snapshot

    def kept(model):
        snapshots.append(real(model))
        return snapshots[-1]

    monkeypatch.setattr(base, "Snapshot", kept)
    bundle = load_bundle(tiny)
    report = run_pipeline(bundle, make_plan(passes=[_AddsATable.name, _AddsACpuNode.name], runtime=WEBGPU_127))
    assert [p.status.startswith("refused") for p in report.passes] == [False, True]
    after_table = snapshots[1]
    assert after_table.proto.ByteSize() < (1 << 20)  # the 16 MB table is not in it
    table = bundle.model.graph.initializers["test/table"].const_value
    assert table is next(t for _, name, t in after_table.held if name == "test/table")
    assert table.numpy()[-1, -1] == (4 << 20) - 1
    assert "test/Mul" not in [n.name for n in bundle.model.graph]


def test_run_all_names_an_unknown_command():
    """bench/run_all --commands (issue 17's short runs: floor,opt-link) refuses a command it does not measure."""
    import subprocess
    import sys
    from pathlib import Path

    run_all = Path(__file__).resolve().parent.parent / "bench" / "run_all"
    done = subprocess.run([sys.executable, str(run_all), "--commands", "floor,opt-lnk", "--only", "llama3-8b"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown command 'opt-lnk'" in done.stderr and "opt-link" in done.stderr
