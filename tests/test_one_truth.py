"""One truth per model (issue 19): every command gives the graph-capture verdict the runtime gives.

The one home is :func:`rope_passes.analysis.placement.capture_verdict`; ``optimize`` (its summary and the
``enableGraphCapture`` it writes), ``inspect`` and ``lint`` read it, and a real capture session (the runtime probe:
a WebGPU session created with ``enableGraphCapture=1``) is the judge. Also here: the placement guard of the pipeline
(no pass may add a Memcpy or a CPU node) and the config that turns capture on.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import GENAI, genai_models
from onnx import TensorProto, helper, numpy_helper

import rope_passes
from rope_passes.analysis.placement import capture_verdict
from rope_passes.cli.inspect_cmd import runtime_verdicts
from rope_passes.config import GenaiConfig
from rope_passes.demo import build_tiny_decoder
from rope_passes.io import load_bundle
from rope_passes.lint import lint_bundle
from rope_passes.passes import ALL_PASSES, RopePass
from rope_passes.pipeline import run_pipeline
from rope_passes.plan import lint_plan, make_plan
from rope_passes.report import PassReport
from rope_passes.runtime.placement_probe import probe_placement
from rope_passes.runtimes.descriptors import WEBGPU_127
from rope_passes.runtimes.installed import RUNTIMES

CAPTURE_BLOCKERS = {"RP202", "RP205"}


def _with_cpu_blocker(folder: Path, capture: str | None = "1") -> Path:
    """The demo decoder with a node 1.27 has no WebGPU kernel for (``Hardmax``) between GPU work: a Memcpy no pass
    removes. ``capture``: the WebGPU entry's enableGraphCapture (None: no WebGPU entry)."""
    model = onnx.load(folder / "model.onnx")
    g = model.graph
    final = g.output[0].name
    producer = next(n for n in g.node if final in n.output)
    producer.output[list(producer.output).index(final)] = "pre_hardmax"
    g.node.extend([helper.make_node("Hardmax", ["pre_hardmax"], ["hard"], "blocker/Hardmax", axis=-1),
                   helper.make_node("Add", ["hard", "pre_hardmax"], [final], "blocker/Add")])
    g.value_info.extend([helper.make_tensor_value_info("pre_hardmax", TensorProto.FLOAT, None),
                         helper.make_tensor_value_info("hard", TensorProto.FLOAT, None)])
    onnx.save(model, folder / "model.onnx", save_as_external_data=True, location="model.onnx.data")
    config = json.loads((folder / "genai_config.json").read_text())
    if capture is not None:
        config["model"]["decoder"]["session_options"]["provider_options"] = [
            {"webgpu": {"enableGraphCapture": capture, "validationMode": "disabled"}}]
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    return folder


# ----------------------------------------------------------------------------------------------------------------
# The demo model: the false positive of issue 19
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.webgpu
def test_demo_after_webgpu_graph_is_capture_ready_everywhere(tmp_path):
    """The project's own demo model after ``optimize --target webgpu-graph``: lint said RP205 (5 Memcpy: the graph
    has no value_info, so every MatMul's type was unknown and it was put on CPU), inspect said blocked, while a
    real capture session works. Now all of them say what the session says, and the config turns capture on."""
    src = build_tiny_decoder(tmp_path / "demo")
    out = tmp_path / "out"
    report = rope_passes.optimize(src, out, preset="webgpu-graph", runtime=WEBGPU_127)
    probe = probe_placement(out / "model.onnx", graph_capture=True)
    assert probe.capture_ok and not probe.memcpy, probe.summary()
    static = capture_verdict(ir.load(out / "model.onnx"), WEBGPU_127)
    assert static.state == "ready" and not static.memcpy and not static.cpu_nodes, static.summary()
    assert report.capture is not None and report.capture["state"] == "ready" and not report.capture["blockers"]
    assert not {d.code for d in lint_bundle(out, lint_plan(runtime=WEBGPU_127))} & (CAPTURE_BLOCKERS | {"RP220", "RP222"})
    [verdict] = runtime_verdicts(load_bundle(out).model, [WEBGPU_127])
    assert verdict["capture"] == "ready" and verdict["verdict"] == "loads; capture-ready (0 Memcpy)"
    options = GenaiConfig.load(out).provider_options("webgpu")
    assert options == {"enableGraphCapture": "1", "validationMode": "disabled"}  # as the builder writes it
    # the input: 2 Memcpy (Shape(attention_mask) -> Gather -> Cast), the same as the session's
    before = probe_placement(src / "model.onnx", graph_capture=True)
    assert capture_verdict(ir.load(src / "model.onnx"), WEBGPU_127).same_memcpy(before) and len(before.memcpy) == 2


def test_untyped_graph_types_are_inferred():
    """The demo graph records no value_info: element types come from the producers (no session)."""
    from rope_passes.demo import build_tiny_decoder_model

    model = ir.from_proto(build_tiny_decoder_model())
    placement = capture_verdict(model, WEBGPU_127)
    assert not placement.unknown, placement.unknown
    assert sorted(placement.cpu_nodes) == [f"/model/attn_mask_reformat/attn_mask_subgraph/{n}"
                                           for n in ("Gather", "ReduceSum", "Shape", "Sub")]


# ----------------------------------------------------------------------------------------------------------------
# Unknown is a note, never a commit-blocking warning
# ----------------------------------------------------------------------------------------------------------------


def _unknown_graph() -> ir.Model:
    """x -> Hardmax (CPU: no WebGPU kernel) -> y (no type recorded) -> Einsum: the static rules know no output type
    for Hardmax, so they cannot place the Einsum that reads it."""
    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], "hm"),
         helper.make_node("Einsum", ["y", "w"], ["z"], "es", equation="ij,jk->ik")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def test_unknown_placement_is_a_note_not_a_warning(tmp_path):
    model = _unknown_graph()
    placement = capture_verdict(model, WEBGPU_127)
    assert placement.state == "unknown" and "es" in placement.unknown and placement.cpu_nodes == {"hm": placement.cpu_nodes["hm"]}
    assert placement.verdict().startswith("loads; capture unknown: run `rope-passes check --graph-capture`")
    ir.save(model, tmp_path / "m.onnx")
    found = {d.code: d for d in lint_bundle(tmp_path / "m.onnx", lint_plan(runtime=WEBGPU_127))}
    assert "RP205" not in found and str(found["RP220"].severity) == "note"


# ----------------------------------------------------------------------------------------------------------------
# The config that turns capture on
# ----------------------------------------------------------------------------------------------------------------


def test_config_capture_switch_adds_the_builder_entry():
    config = GenaiConfig({"model": {"decoder": {"session_options": {"provider_options": []}}}})
    assert config.graph_capture is None
    line = config.set_graph_capture(True)
    assert config.provider_options("webgpu") == {"enableGraphCapture": "1", "validationMode": "disabled"}
    assert config.graph_capture is True and "enableGraphCapture = '1'" in (line or "")
    assert config.set_graph_capture(True) is None  # already on: nothing to say
    assert "(was '1')" in (config.set_graph_capture(False) or "") and config.graph_capture is False
    keep = GenaiConfig({"model": {"decoder": {"session_options": {"provider_options": [
        {"webgpu": {"enableGraphCapture": "0", "validationMode": "basic"}}]}}}})
    keep.set_graph_capture(True)
    assert keep.provider_options("webgpu") == {"enableGraphCapture": "1", "validationMode": "basic"}
    assert GenaiConfig(None).set_graph_capture(True) is None


def test_optimize_leaves_capture_off_and_names_the_blocker(tmp_path):
    """Not capture-ready after the passes: the config's "1" is turned off (onnxruntime-genai would fail at session
    creation), each blocker is named with its node; lint says RP221 (error) on the input, nothing on the output."""
    src = _with_cpu_blocker(build_tiny_decoder(tmp_path / "demo"))
    found = {d.code: d for d in lint_bundle(src, lint_plan(runtime=WEBGPU_127))}
    assert str(found["RP221"].severity) == "error"
    report = rope_passes.optimize(src, tmp_path / "out", preset="webgpu-graph", runtime=WEBGPU_127)
    capture = report.capture
    assert capture is not None and capture["state"] == "blocked"
    # MemcpyToHost into the Hardmax, MemcpyFromHost out of it: both name the CPU node
    assert [b["node"] for b in capture["blockers"]] == ["blocker/Hardmax"] * 2, capture["blockers"]
    assert "enableGraphCapture = '0' (was '1')" in capture["config"]
    assert GenaiConfig.load(tmp_path / "out").graph_capture is False
    codes = {d.code for d in lint_bundle(tmp_path / "out", lint_plan(runtime=WEBGPU_127))}
    assert "RP205" in codes and "RP221" not in codes


def test_capture_ready_but_off_is_a_note(tmp_path):
    src = build_tiny_decoder(tmp_path / "demo")
    rope_passes.optimize(src, tmp_path / "out", preset="webgpu-graph", runtime=WEBGPU_127)
    path = tmp_path / "out" / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["provider_options"][0]["webgpu"]["enableGraphCapture"] = "0"
    path.write_text(json.dumps(config))
    found = {d.code: d for d in lint_bundle(tmp_path / "out", lint_plan(runtime=WEBGPU_127))}
    assert str(found["RP222"].severity) == "note" and "RP221" not in found


# ----------------------------------------------------------------------------------------------------------------
# No pass makes placement worse
# ----------------------------------------------------------------------------------------------------------------


class _AddsACpuNode(RopePass):
    """A pass that puts an int64 ``Mul`` (no WebGPU kernel in 1.27) between GPU work: one more CPU node, two more
    Memcpy. It also writes the config, to see the roll-back reach it."""

    name = "test-adds-cpu-node"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        ids = model.graph.inputs[0]  # input_ids, int64, read by the embedding Gather
        gather = next(n for n in model.graph if n.op_type == "Gather" and n.inputs[1] is ids)
        two = ir.Value(name="two", const_value=ir.tensor(np.array(1, np.int64)))
        model.graph.register_initializer(two)
        mul = ir.node("Mul", [ids, two], name="test/Mul")
        model.graph.insert_before(gather, mul)
        gather.replace_input_with(1, mul.outputs[0])
        report.rewritten("test/Mul", "multiplied input_ids by 1 on CPU")
        if self.genai_config.present:
            report.genai_config_changes.append(self.genai_config.set_provider_option("webgpu", "x", "1") or "")


def test_a_pass_that_adds_a_cpu_node_is_refused_and_rolled_back(tmp_path, monkeypatch):
    monkeypatch.setitem(ALL_PASSES, _AddsACpuNode.name, _AddsACpuNode)
    bundle = load_bundle(build_tiny_decoder(tmp_path / "demo"))
    config = json.dumps(bundle.genai_config.data)
    report = run_pipeline(bundle, make_plan(passes=["total-seq-on-gpu", _AddsACpuNode.name], runtime=WEBGPU_127))
    done, refused = report.passes
    assert done.modified and not refused.modified and refused.status.startswith("refused: refused for this model")
    assert "Memcpy 0→" in refused.status and "CPU nodes 0→1 (new: test/Mul)" in refused.status, refused.status
    assert "test/Mul" not in [n.name for n in bundle.model.graph]
    embed = next(n for n in bundle.model.graph if n.name == "/model/embed_tokens/Gather")
    assert embed.inputs[1] is bundle.model.graph.inputs[0]  # reads input_ids again
    assert capture_verdict(bundle.model, WEBGPU_127).state == "ready"  # total-seq-on-gpu's work kept
    assert json.dumps(bundle.genai_config.data) == config  # the refused pass's config write rolled back too
    # the weights still read from the input's data file after the roll-back
    tensor = bundle.model.graph.initializers["model.embed_tokens.weight"].const_value
    assert tensor.numpy().shape == (512, 64)


# ----------------------------------------------------------------------------------------------------------------
# Every command agrees with a real capture session (shared corpus + demo, inputs and webgpu-graph outputs)
# ----------------------------------------------------------------------------------------------------------------


def _verdicts(folder: Path, runtime: str, report=None) -> dict[str, object]:
    codes = {d.code for d in lint_bundle(folder, lint_plan(runtime=runtime))}
    [inspect] = runtime_verdicts(load_bundle(folder).model, [runtime])
    probe = probe_placement(folder / "model.onnx", graph_capture=True, runtime=runtime)
    out = {"lint": bool(codes & CAPTURE_BLOCKERS), "inspect": inspect["capture"] == "blocked",
           "session": probe.loads and not probe.capture_ok, "unknown": inspect["capture"] == "unknown",
           "ready": inspect["capture"] == "ready", "session_ok": bool(probe.capture_ok)}
    if report is not None:
        out["optimize"] = bool(report.capture["blockers"])
        out["config_on"] = GenaiConfig.load(folder).graph_capture is True
    return out


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_command_agrees_with_a_capture_session(genai_corpus, tmp_path, runtime):
    """lint RP202/RP205 ⇔ inspect "blocked" ⇔ optimize lists a blocker ⇔ a real capture session fails, and
    enableGraphCapture "1" ⇔ the session works, on every genai corpus folder and the demo model, before and after
    ``optimize --target webgpu-graph`` (``--text-only`` too for the mRoPE folders), on each WebGPU runtime (the
    plugin's sessions in its own interpreter, as tests/test_placement.py). None of these is "unknown" to the static
    rules."""
    inputs = {rel: GENAI / rel for rel in genai_models()}
    inputs["demo"] = build_tiny_decoder(tmp_path / "demo")
    bad = []
    for name, src in inputs.items():
        runs = [(name, src, None)]
        for text in (False, True):
            if text and "qwen" not in name:
                continue
            out = tmp_path / "out" / (name.replace("/", "_") + ("--text-only" if text else ""))
            report = rope_passes.optimize(src, out, preset="webgpu-graph", runtime=runtime, weights="copy",
                                          options={"text_only": True} if text else None)
            runs.append((f"{name} -> webgpu-graph{' --text-only' if text else ''}", out, report))
        for label, folder, report in runs:
            v = _verdicts(folder, runtime, report)
            claims = [v["lint"], v["inspect"], v["session"]] + ([v["optimize"]] if report is not None else [])
            agree = len(set(claims)) == 1 and not v["unknown"] and v["ready"] == v["session_ok"]
            if report is not None:
                agree = agree and v["config_on"] == v["session_ok"]
            if not agree:
                bad.append(f"{label}: {v}")
    assert not bad, "\n".join(bad)


def test_the_verdict_reads_a_model_optimize_hard_linked(tmp_path):
    """``optimize --weights link`` leaves the data file with two hard links, which plain ``onnx_ir.load`` refuses to
    read ("may indicate a hard link attack") once a small constant is read; the verdict by path must still come."""
    src = build_tiny_decoder(tmp_path / "demo")
    rope_passes.optimize(src, tmp_path / "out", preset="webgpu-graph", weights="link", runtime=WEBGPU_127)
    for path in (src / "model.onnx", tmp_path / "out" / "model.onnx"):
        assert capture_verdict(path, WEBGPU_127).state in ("ready", "blocked")


def test_only_config_opens_genai_config_json(tmp_path, monkeypatch):
    """Every read of genai_config.json goes through rope_passes.config (GenaiConfig): optimize (webgpu-graph, which
    reads and writes it), lint and inspect's census open it for reading from there and nowhere else (io/save.py
    copies an unchanged file's bytes as they are: no fact read)."""
    import io
    import traceback

    from rope_passes.analysis.census import census

    opened: list[str] = []
    real_open = io.open

    def spy(file, mode="r", *args, **kwargs):
        if str(file).endswith("genai_config.json") and not set(mode) & set("wax+"):
            frames = [f.filename for f in traceback.extract_stack()[:-1] if "/rope_passes/" in f.filename]
            opened.append(frames[-1].split("/rope_passes/")[-1] if frames else "<not rope_passes>")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr("builtins.open", spy)
    src = build_tiny_decoder(tmp_path / "demo")
    rope_passes.optimize(src, tmp_path / "out", preset="webgpu-graph", runtime=WEBGPU_127, weights="copy")
    lint_bundle(tmp_path / "out", lint_plan(runtime=WEBGPU_127))
    bundle = load_bundle(tmp_path / "out")
    census(bundle.model, bundle.genai_config)
    # io/files.py reads its bytes (hashed, compared), never its JSON
    assert opened and set(opened) <= {"config.py", "io/save.py", "io/files.py"}, opened
    assert "config.py" in opened
