"""``multiRotaryCacheConcatOffset`` is one value for the whole session (issue 18, "session scope").

onnxruntime's WebGPU EP holds the offset as a provider option and applies it to every GroupQueryAttention with
do_rotary=1 and packed QKV: row ``(total > offset ? offset : 0) + position`` of that node's own cos/sin cache. So
``longrope-concat`` and ``annotate-cache-offset`` must prove it for every such node, not for the one ``If`` or table
they found; and an offset in genai_config.json that no node can honour must go (``optimize``) and is a lint error
(RP208; RP209 when it is right for some layers and wrong for others).

Graphs: the session mutants of ``tests/mutants`` (the corpus Phi-3 graph with layer 1 made to read a plain table, a
second ``If`` at another threshold or over other tables; llama / Phi-3 with a stale offset). Independent references:
the mutant itself on onnxruntime's CPU EP (which has no offset), decoded across the switch; the rewrite on real
WebGPU (lavapipe) with the offset as a session config entry. WebGPU prefills stay at 8 tokens (lavapipe defect, see
../shared/docs/webgpu-on-cpu.md) and 44 tokens are reached by decode steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from conftest import GENAI
from mutants import Mutant, all_mutants

from rope_passes.analysis.graph import nodes_of
from rope_passes.analysis.longrope import if_switch
from rope_passes.api import optimize
from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
from rope_passes.io import load_bundle, save_bundle
from rope_passes.lint import fix_bundle, lint_bundle
from rope_passes.passes.longrope_concat import LongRoPEConcatPass
from rope_passes.report import Outcome
from rope_passes.runtime.sessions import create_session

pytestmark = [pytest.mark.corpus]

KEY = "multiRotaryCacheConcatOffset"
ORIGINAL = 32
#: fp32 logits, WebGPU vs CPU kernels over 37 decode steps: the corpus Phi-3 rewrite measures ~8e-6 (docs/passes/
#: longrope-concat.md); a wrong table row moves logits by > 1
DECODE_TOL = 1e-3
MUTANTS = {m.name: m for m in all_mutants()}


def _build(name: str, tmp: Path) -> tuple[Mutant, Path]:
    mutant = MUTANTS[name]
    return mutant, mutant.build(tmp / "mutant").path


def _offset(folder: Path) -> str | None:
    config = json.loads((folder / "genai_config.json").read_text())
    for entry in config["model"]["decoder"].get("session_options", {}).get("provider_options", []):
        for options in entry.values():
            if KEY in options:
                return options[KEY]
    return None


def _pass(report, name):
    return next(p for p in report.passes if p.pass_name == name)


# --- a stale offset: removed by optimize and lint --fix, an error for lint -------------------------------------------


@pytest.mark.parametrize("name", ["annotate-offset-on-llama", "annotate-offset-on-plain-tables",
                                  "annotate-offset-on-plain-288-rows", "annotate-offset-on-if-switch"])
def test_stale_offset_is_a_lint_error_and_optimize_removes_it(name, tmp_path):
    _, path = _build(name, tmp_path)
    assert _offset(path) == "32"
    found = [d for d in lint_bundle(path) if d.code == "RP208"]
    assert len(found) == 1 and found[0].severity == "error" and found[0].fix == "annotate-cache-offset", found
    assert f"{KEY}=32" in found[0].message and "no layer can honour it" in found[0].message
    report = optimize(str(path), str(tmp_path / "out"), preset="webgpu-graph")
    annotate = _pass(report, "annotate-cache-offset")
    removed = [c for c in annotate.genai_config_changes if c.startswith("removed") and KEY in c]
    assert len(removed) == 1 and "no layer can honour" in removed[0], annotate.genai_config_changes
    assert annotate.count(Outcome.REWRITTEN) == 1, annotate.status
    assert _offset(tmp_path / "out") is None
    assert not [d for d in lint_bundle(tmp_path / "out") if d.code in ("RP208", "RP209")]


def test_an_offset_a_same_factor_table_needs_is_kept(tmp_path):
    """[short[:32]; short RoPE restarted at 0] with offset 32: not LongRoPE (refused as before), but not plain either:
    the table is right only at that offset, so neither optimize nor lint --fix removes it, and RP208 is silent."""
    _, path = _build("annotate-same-factors-offset-kept", tmp_path)
    assert not [d for d in lint_bundle(path) if d.code in ("RP208", "RP209")]
    optimize(str(path), str(tmp_path / "out"), preset="webgpu-graph")
    assert _offset(tmp_path / "out") == "32"


def test_lint_fix_removes_a_stale_offset(tmp_path):
    _, path = _build("annotate-offset-on-llama", tmp_path)
    assert fix_bundle(str(path), log=lambda _: None)[0] == "annotate-cache-offset"
    assert _offset(path) is None
    assert not [d for d in lint_bundle(path) if d.code.startswith("RP20") and d.severity == "error"]


def test_a_wrong_offset_says_where_the_table_splits(tmp_path):
    """The builder's concatenated graph with genai_config's offset 16: RP208 names the real split; the fix writes
    it."""
    _, path = _build("annotate-offset-wrong-16", tmp_path)
    (found,) = [d for d in lint_bundle(path) if d.code == "RP208"]
    assert f"{KEY}=16" in found.message and "splits at 32" in found.message, found.message
    fix_bundle(str(path), log=lambda _: None)
    assert _offset(path) == "32"
    assert not [d for d in lint_bundle(path) if d.code in ("RP208", "RP209")]


def test_an_offset_right_for_one_layer_and_wrong_for_another_is_rp209(tmp_path):
    """Layer 1 reads a plain table, layer 0 the concatenation, offset 32 configured: RP209 names layer 1 (no fix:
    annotate-cache-offset refuses it too, naming the same node, and leaves the config as it is)."""
    _, path = _build("annotate-layer1-plain-offset-kept", tmp_path)
    found = [d for d in lint_bundle(path) if d.code in ("RP208", "RP209")]
    assert [(d.code, d.target) for d in found] == [("RP209", "/model/layers.1/attn/GroupQueryAttention")], found
    assert found[0].fix is None and "one value for the whole session" in found[0].message
    report = optimize(str(path), str(tmp_path / "out"), preset="webgpu-graph")
    annotate = _pass(report, "annotate-cache-offset")
    (refused,) = [f for f in annotate.findings if f.outcome is Outcome.REFUSED]
    assert refused.place == "/model/layers.1/attn/GroupQueryAttention"
    assert _offset(tmp_path / "out") == "32" and not annotate.genai_config_changes


def test_builder_graph_lints_clean_of_the_session_rules(genai_corpus):
    from conftest import GENAI

    found = [d for d in lint_bundle(GENAI / "current/phi3_mini_128k/webgpu_fp16_graph") if d.code in ("RP208", "RP209")]
    assert not found, found


# --- longrope-concat: every consumer, one offset ----------------------------------------------------------------------


@pytest.mark.parametrize("name,reads", [
    ("longrope-cpu-layer1-plain-long", "the plain constant table"),
    ("longrope-cpu-second-switch-at-24", "which switches at total > 24"),
    ("longrope-cpu-second-switch-greater-equal", "which switches at total > 31"),
    ("longrope-cpu-second-switch-on-call-length", "refused on its own"),
])
def test_longrope_concat_refuses_naming_the_layer_the_offset_breaks(name, reads, tmp_path):
    _, path = _build(name, tmp_path)
    report = optimize(str(path), str(tmp_path / "out"), preset="webgpu-graph")
    longrope = _pass(report, "longrope-concat")
    assert longrope.count(Outcome.REWRITTEN) == 0, longrope.status
    session = [f for f in longrope.findings if f.outcome is Outcome.REFUSED and "not rewritten" in f.reason]
    assert session and all(f.place == "/model/layers.1/attn/GroupQueryAttention" for f in session), session
    assert any(reads in f.reason for f in session), [f.reason for f in session]
    out = ir.load(tmp_path / "out" / "model.onnx")
    assert "/model/rope_caches_subgraph/If" in {n.name for n in nodes_of(out, "If")}
    assert _offset(tmp_path / "out") is None


def test_two_switches_at_one_offset_are_both_rewritten(tmp_path):
    _, path = _build("longrope-cpu-second-switch-other-long-table", tmp_path)
    report = optimize(str(path), str(tmp_path / "out"), preset="webgpu-graph")
    longrope = _pass(report, "longrope-concat")
    assert longrope.status == "rewritten 2", longrope.status
    assert not nodes_of(ir.load(tmp_path / "out" / "model.onnx"), "If")
    assert _offset(tmp_path / "out") == "32"


# --- on WebGPU: the hole as it was, and the outputs now --------------------------------------------------------------


def _decode(folder: Path, ep: str, offset: int | None, total: int = 44) -> list[np.ndarray]:
    """Last-token logits after each call: prefill 8, then single steps to ``total`` tokens."""
    bundle = load_bundle(folder)
    options = {KEY: str(offset)} if offset else None
    sess = create_session(str(folder / "model.onnx"), ep, webgpu_options=options)
    spec = DecoderSpec.from_session(sess, bundle.genai_config)
    return [s["logits"][0, -1] for s in run_decode(sess, spec, token_ids(total), prefill=8, steps=total - 8)]


def _errors(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float]:
    """Worst |logits difference| at totals <= ORIGINAL and > ORIGINAL (row k = after 8 + k tokens)."""
    errors = [float(np.max(np.abs(x - y))) for x, y in zip(a, b)]
    before = [e for k, e in enumerate(errors) if 8 + k <= ORIGINAL]
    after = [e for k, e in enumerate(errors) if 8 + k > ORIGINAL]
    return max(before), max(after)


def _rewrite_every_if_alone(path: Path, dest: Path, offset: int) -> None:
    """What longrope-concat did before the session proof: each If rewritten on its own proof, one offset for all."""
    bundle = load_bundle(path)
    model = bundle.model
    for node in list(nodes_of(model, "If")):
        gqas = [u for out in node.outputs for u, _ in out.uses() if u.op_type == "GroupQueryAttention"]
        own, tables = LongRoPEConcatPass._match(model, if_switch(model, node), gqas)
        LongRoPEConcatPass._rewrite(model.graph, node, tables, own, None, None)  # constant [short; long] tables
    bundle.genai_config.set_provider_option("webgpu", KEY, str(offset))
    save_bundle(bundle, dest)


@pytest.mark.webgpu
@pytest.mark.parametrize("name", ["longrope-cpu-layer1-plain-long", "longrope-cpu-second-switch-at-24"])
def test_the_session_hole_on_webgpu_and_the_refusal(name, tmp_path):
    """The mutant on CPU is the reference. The per-If rewrite (what b8a2a5f did) decoded on WebGPU with the offset
    is right up to the first switch and off by > 1 after it; the session proof refuses, and the output (the Ifs kept)
    decodes on WebGPU like the mutant on CPU at every step."""
    _, path = _build(name, tmp_path)
    reference = _decode(path, "cpu", None)
    # second-switch-at-24: both Ifs rewritten, each to its own concatenation; the session carries one offset, 32
    _rewrite_every_if_alone(path, tmp_path / "naive", ORIGINAL)
    before, after = _errors(_decode(tmp_path / "naive", "webgpu", ORIGINAL), reference)
    assert after > 1.0, (before, after)  # wrong past the switch: the hole
    if name.endswith("plain-long"):
        assert before <= DECODE_TOL, before  # (the switch at 24 is already wrong at totals 25..32)
    report = optimize(str(path), str(tmp_path / "out"), passes=["longrope-concat", "cleanup"])
    assert _pass(report, "longrope-concat").count(Outcome.REWRITTEN) == 0
    before, after = _errors(_decode(tmp_path / "out", "webgpu", _offset(tmp_path / "out")), reference)
    assert before <= DECODE_TOL and after <= DECODE_TOL, (before, after)


@pytest.mark.webgpu
@pytest.mark.parametrize("name", ["longrope-cpu-second-switch-other-long-table",
                                  "longrope-cpu-layer1-separate-qkv-plain"])
def test_rewrites_the_session_proof_allows_are_right_on_webgpu(name, tmp_path):
    """Two switches at 32 over different long tables (both rewritten), or layer 1 reading a plain table through
    separate Q/K/V (WebGPU's separate-QKV path does not read the offset): decoded on WebGPU with the offset the output
    carries, equal to the mutant on CPU before and after the switch."""
    _, path = _build(name, tmp_path)
    report = optimize(str(path), str(tmp_path / "out"), passes=["longrope-concat", "cleanup"])
    assert _pass(report, "longrope-concat").count(Outcome.REWRITTEN) >= 1
    offset = int(_offset(tmp_path / "out") or 0)
    assert offset == ORIGINAL
    before, after = _errors(_decode(tmp_path / "out", "webgpu", offset), _decode(path, "cpu", None))
    assert before <= DECODE_TOL and after <= DECODE_TOL, (before, after)


# --- independent red team (issue 18): consumers in functions, genai_config lengths that do not add up ----------------


def _copy(name: str, tmp: Path, **config_edits) -> Path:
    from _utils import copy_folder

    return copy_folder(GENAI / name, tmp / "src", lambda config: config["model"].update(config_edits))


@pytest.mark.parametrize("name", ["current/phi3_mini_128k/webgpu_fp16_graph", "current/phi3_mini_128k/webgpu_fp32"])
def test_a_context_length_past_the_table_keeps_the_offset(name, tmp_path):
    """genai_config context_length 512 over a [32 short; 256 long] table (G13, G24): the rows decide, not the metadata.
    Before, annotate-cache-offset read the table as plain and removed the builder's offset 32 (or the one
    longrope-concat had just written): WebGPU logits off by up to 6.9 from total 33."""
    src = _copy(name, tmp_path, context_length=512)
    optimize(str(src), str(tmp_path / "out"), preset="webgpu-graph")
    assert _offset(tmp_path / "out") == "32"
    assert not [d for d in lint_bundle(tmp_path / "out") if d.code in ("RP208", "RP209")]


def test_a_groupqueryattention_in_a_model_local_function_breaks_the_session_proof(tmp_path):
    """Layer 1's GroupQueryAttention moved into a model-local function (onnxruntime inlines it; WebGPU applies the
    offset there too). Before, the graph walk never saw it: longrope-concat wrote offset 32 while that layer reads a
    plain table (G01), and annotate-cache-offset removed the builder's offset from a graph whose layers are all in
    functions (G02). Now both refuse, naming the function."""
    import onnx
    from onnx import helper

    src = _copy("current/phi3_mini_128k/webgpu_fp32", tmp_path)
    model = onnx.load(src / "model.onnx")
    nodes = []
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and "layers.1/" in node.name:
            ins = list(node.input)
            formal = [f"i{k}" if x else "" for k, x in enumerate(ins)]
            outs = [f"o{k}" for k in range(len(node.output))]
            inner = helper.make_node("GroupQueryAttention", formal, outs, domain="com.microsoft", name="inner")
            inner.attribute.extend(node.attribute)
            model.functions.append(helper.make_function(
                "rt.fn", "Attn1", [x for x in formal if x], outs, [inner],
                [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]))
            nodes.append(helper.make_node("Attn1", [x for x in ins if x], list(node.output), domain="rt.fn",
                                          name=node.name + "/call"))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import.append(helper.make_opsetid("rt.fn", 1))
    onnx.save(model, src / "model.onnx")
    report = optimize(str(src), str(tmp_path / "out"), preset="webgpu-graph")
    assert _pass(report, "longrope-concat").count(Outcome.REWRITTEN) == 0
    annotate = _pass(report, "annotate-cache-offset")
    assert annotate.count(Outcome.REFUSED) == 1 and "rt.fn::Attn1" in annotate.status, annotate.status
    assert _offset(tmp_path / "out") is None
    # the function's layer reads the If's output through the call: longrope-concat refuses whatever the reason; with
    # the If proved for every node it sees, the function is what it names
    from rope_passes.proofs.concat_offset import hidden_attention

    assert hidden_attention(load_bundle(src).model) == "rt.fn::Attn1"


def test_a_concatenation_the_context_length_cannot_split_is_found_by_its_rows(tmp_path):
    """mobius-onnx writes context_length 4096 and no offset over its [128 short; 512 long] cache (independent set,
    issue 21, M11): wrong on WebGPU past 128 tokens. Here the builder's [32; 256] table with context_length 4096 and
    the offset taken out: the long half starts where sin is 0 in every column again. Before, lint said nothing of it
    (only RP302) and annotate-cache-offset matched nothing; now RP203 is an error and the pass writes 32."""
    src = _copy("current/phi3_mini_128k/webgpu_fp16_graph", tmp_path, context_length=4096)
    path = src / "genai_config.json"
    config = json.loads(path.read_text())
    for entry in config["model"]["decoder"]["session_options"]["provider_options"]:
        for options in entry.values():
            options.pop(KEY, None)
    path.write_text(json.dumps(config, indent=4))
    assert _offset(src) is None
    (found,) = [d for d in lint_bundle(src) if d.code == "RP203"]
    assert found.severity == "error" and "32 short + 256 long" in found.message, found.message
    optimize(str(src), str(tmp_path / "out"), preset="webgpu")
    assert _offset(tmp_path / "out") == "32"
    assert not [d for d in lint_bundle(tmp_path / "out") if d.code in ("RP203", "RP208", "RP209")]


@pytest.mark.parametrize("op", ["Identity", "Add0"])
def test_a_cache_read_through_a_node_keeps_the_offset(op, tmp_path):
    """Round 2 of the independent red team (W01): the builder's [32; 256] cache fed to GroupQueryAttention through
    one node (Identity, or Add of 0). Before, "not a constant table" was read as "no layer can honour it" and the
    offset removed (WebGPU logits off by 6.9 from total 33); now the one constant evaluator reads the table through
    the node (the offset stays, no RP208), and a table it cannot read is a refusal, never proof of a plain one."""
    import onnx
    from onnx import helper, numpy_helper

    src = _copy("current/phi3_mini_128k/webgpu_fp16_graph", tmp_path)
    model = onnx.load(src / "model.onnx")
    gqas = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    added = []
    for index, name in ((7, "cos"), (8, "sin")):
        table = gqas[0].input[index]
        wrapped = f"rt_{name}_wrapped"
        if op == "Identity":
            added.append(helper.make_node("Identity", [table], [wrapped]))
        else:
            zero = f"rt_{name}_zero"
            model.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float16), zero))
            added.append(helper.make_node("Add", [table, zero], [wrapped]))
        for gqa in gqas:
            gqa.input[index] = wrapped
    for node in reversed(added):
        model.graph.node.insert(0, node)
    onnx.save(model, src / "model.onnx")
    assert _offset(src) == "32"
    assert not [d for d in lint_bundle(src) if d.code in ("RP208", "RP209")]
    optimize(str(src), str(tmp_path / "out"), preset="webgpu")
    assert _offset(tmp_path / "out") == "32"


def test_an_offset_one_row_off_without_a_context_length_is_rp208(tmp_path):
    """Round 2 (N20): offset 33 on the builder's [32; 256] cache with no context_length in genai_config: before, no
    RP208 (the real split was looked for by the context length only); now the rows say where it is."""
    def edit(config):
        config["model"].pop("context_length", None)
        config.get("search", {}).pop("max_length", None)
        for entry in config["model"]["decoder"]["session_options"]["provider_options"]:
            for options in entry.values():
                if KEY in options:
                    options[KEY] = "33"

    from _utils import copy_folder

    src = copy_folder(GENAI / "current/phi3_mini_128k/webgpu_fp16_graph", tmp_path / "src", edit)
    (found,) = [d for d in lint_bundle(src) if d.code == "RP208"]
    assert f"{KEY}=33" in found.message and "splits at 32" in found.message, found.message
