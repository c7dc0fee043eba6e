"""Mutation suite (issue 11, "Proofs, not patterns"): graphs that look like a form a pass rewrites and compute
something else, generated from the shared corpus graphs by ``tests/mutants``.

For every mutant the pass's preset runs (``rope_passes.optimize``) and the outcome at the attacked place is one of

* ``refused``: no rewrite there, a refused/not-matched finding whose target (or reason) names a node of the graph,
  and the place left as it was (GQA still ``do_rotary=0``, the ``If`` / Cos / Sin nodes still there, GQA's length
  inputs still wired to the old chain, genai_config's offset unchanged);
* ``rewritten-equivalent``: rewritten, and the output computes what the mutant computes on an independent reference
  (:mod:`mutants.oracle`) over calls varying past length (0, 5, 37; around 32 for LongRoPE), call length (1, 3, 8)
  and batch (1, 2);
* ``REWRITTEN-AND-WRONG``: rewritten, and the reference disagrees (or the output fails where the mutant runs).

A ``refuse`` mutant must be ``refused``; an ``equivalent`` one ``refused`` or ``rewritten-equivalent``. Wrong
rewrites are bugs in the passes' proofs: their tests fail until the proofs are fixed (a known one may be listed in
``KNOWN_WRONG``: a strict expected failure, reported as such, that fails again the day it is fixed). The output must
also keep every graph output of the mutant, with its type (values are compared as float64), and load: an output
that cannot be loaded is a wrong rewrite.

References (``Mutant.reference``): the mutant on onnxruntime CPU; the mutant on onnxruntime >= 1.31's CPU EP for
``MRotaryEmbedding`` (``.venv-plugin``, :mod:`mutants.plugin`: 1.27 has no such kernel); the test's own lowerings of
``MRotaryEmbedding`` and of GQA's fused q/k-norm (:mod:`mutants.qknorm`, checked against the plugin's WebGPU kernel:
1.31's CPU EP does not implement it); WebGPU's cache offset emulated. Feeds may carry image positions (three
different axes) or left-padded masks (``Mutant.vision`` / ``Mutant.padded``).

Tolerances: float32 1e-5 (absolute and relative: the fold moves the rotation into GQA's kernel, a few ulps); float16
5e-2 (an fp16 ulp at |x| ~ 30 is 0.016; the rewrites under test here move no float math, only tables and offsets).
Set ``ROPE_MUTANTS_TABLE=path.md`` to write the outcome table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import mutants.qknorm as qknorm
import numpy as np
import onnx_ir as ir
import pytest
from mutants import CALLS, CLASSES, CORPUS, EQUIVALENT, LONGROPE_CALLS, REFUSE, Built, Mutant, all_mutants, oracle
from mutants import plugin as plugin_runtime

import rope_passes
from rope_passes.passes import ALL_PASSES
from rope_passes.report import Outcome

MUTANTS = all_mutants()
#: Mutants a pass rewrites wrongly today (or crashes on), found by this suite and written up in
#: /work/notes/findings.md for the pass's owner: name -> the finding. They run as strict expected failures, so the
#: suite reports them (xfailed) and fails (XPASS strict) the day the pass is fixed: then delete the entry.
KNOWN_WRONG: dict[str, str] = {}
RESULTS: dict[str, dict] = {}
OFFSET_KEY = "multiRotaryCacheConcatOffset"
OFFSET_METADATA = "rope_passes.multi_rotary_cache_concat_offset"


@dataclasses.dataclass
class Result:
    outcome: str  # refused | refused-without-node | touched-without-finding | rewritten-equivalent | REWRITTEN-AND-WRONG
    #             | rewritten-unjudged (the reference ran none of the calls: a mutant that can judge nothing fails)
    detail: str
    findings: list[str]


# ------------------------------------------------------------------------------------------------------------
# Reading the report and the output
# ------------------------------------------------------------------------------------------------------------
def _graph_names(path: Path) -> set[str]:
    model = ir.load(path)
    names = set()
    for node in model.graph:
        names.add(node.name)
        names.update(v.name for v in node.inputs if v is not None and v.name)
        names.update(v.name for v in node.outputs if v.name)
    names.update(v.name for v in model.graph.inputs)
    names.discard("")
    return names


def _names_a_node(finding, names: set[str]) -> bool:
    if finding.place in names:
        return True
    return any(f"'{n}'" in finding.reason or f'"{n}"' in finding.reason for n in names)


def _config(folder: Path) -> dict | None:
    path = folder / "genai_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _config_offset(config: dict | None) -> int:
    if not config:
        return 0
    for entry in config["model"]["decoder"].get("session_options", {}).get("provider_options", []):
        if "webgpu" in entry and OFFSET_KEY in entry["webgpu"]:
            return int(entry["webgpu"][OFFSET_KEY])
    return 0


def _rewritten_here(mutant: Mutant, report, places: tuple[str, ...]) -> list:
    found = [f for f in report.findings if f.outcome is Outcome.REWRITTEN and f.place in places]
    if mutant.pass_name == "narrow-int64" and mutant.expect == EQUIVALENT:  # placement is the whole graph's: a node
        # narrowed anywhere is judged (nodes earlier passes made too); a refuse mutant names the nodes to be left
        found = [f for f in report.findings if f.outcome is Outcome.REWRITTEN]
    if mutant.pass_name == "annotate-cache-offset" and report.genai_config_changes:
        found = found or [f for f in report.findings if f.outcome is Outcome.REWRITTEN] or ["config changed"]
    return found


def _untouched(mutant: Mutant, built: Built, out_model: Path, out_folder: Path | None) -> str | None:
    """None when the attacked place is as it was in the mutant; otherwise what changed."""
    before, after = ir.load(built.model_file), ir.load(out_model)
    nodes = {n.name: n for n in after.graph}
    old = {n.name: n for n in before.graph}
    if mutant.pass_name == "fold-text-mrope":
        for name in built.places:
            attr = nodes[name].attributes.get("do_rotary") if name in nodes else None
            if name not in nodes or (attr is not None and attr.value):
                return f"{name} was folded (do_rotary=1) or removed"
    elif mutant.pass_name in ("longrope-concat", "precompute-cos-sin"):
        for name in built.places:
            if name not in nodes or nodes[name].op_type != old[name].op_type:
                return f"{name} ({old[name].op_type}) is gone from the output"
    elif mutant.pass_name == "total-seq-on-gpu":
        for name in built.places:
            if (name in old and old[name].op_type == "GroupQueryAttention"
                    and nodes[name].inputs[6].name != old[name].inputs[6].name):
                return f"{name}'s total_sequence_length now reads {nodes[name].inputs[6].name!r}"
    elif mutant.pass_name == "narrow-int64":
        for name in built.places:
            if name not in nodes or [v.dtype for v in nodes[name].outputs] != [v.dtype for v in old[name].outputs] \
                    or [v.name for v in nodes[name].inputs if v is not None] != \
                    [v.name for v in old[name].inputs if v is not None]:
                return f"{name} was narrowed or rewired"
    elif mutant.pass_name == "lower-mrope":
        for name in built.places:
            if name not in nodes or nodes[name].op_type != "MRotaryEmbedding":
                return f"{name} (MRotaryEmbedding) is gone from the output"
    elif mutant.pass_name == "unfuse-gqa-qk-norm":
        for name in built.places:
            if name not in nodes or len(nodes[name].inputs) != len(old[name].inputs):
                return f"{name}'s fused q/k-norm inputs changed"
    elif mutant.pass_name == "annotate-cache-offset":
        if _config_offset(_config(out_folder)) != _config_offset(_config(built.path)):
            return "genai_config's offset changed"
        if OFFSET_METADATA in after.metadata_props:
            return "the model metadata got an offset"
    return None


# ------------------------------------------------------------------------------------------------------------
# The reference
# ------------------------------------------------------------------------------------------------------------
def _runners(mutant: Mutant, built: Built, out_model: Path, out_folder: Path | None):
    kind = mutant.reference
    if kind == "ort":
        pair = oracle.Runner(built.model_file), oracle.Runner(out_model)
    elif kind == "plugin":
        pair = plugin_runtime.PluginRunner(built.model_file), oracle.Runner(out_model)
    elif kind == "mrotary-oracle":
        model = oracle.load_in_memory(built.model_file)
        oracle.lower_mrotary(model)
        pair = oracle.Runner(model), oracle.Runner(out_model)
    elif kind == "qknorm-oracle":
        model = oracle.load_in_memory(built.model_file)
        qknorm.lower_qk_norm(model)
        pair = qknorm.UnfusedRunner(model), oracle.Runner(out_model)
    else:
        offset = _config_offset(_config(out_folder)) if out_folder is not None else 0
        if kind == "offset":
            pair = oracle.Runner(built.model_file), oracle.Runner(out_model, offset=offset)
        elif kind == "offset-truth":
            pair = (oracle.Runner(built.model_file, offset=mutant.truth_offset),
                    oracle.Runner(out_model, offset=offset))
        else:
            raise AssertionError(f"unknown reference {kind!r}")
    if mutant.vision:
        pair = plugin_runtime.VisionPositions(pair[0]), plugin_runtime.VisionPositions(pair[1])
    if mutant.padded:
        pair = plugin_runtime.LeftPaddedMask(pair[0]), plugin_runtime.LeftPaddedMask(pair[1])
    return pair


def _numeric(mutant: Mutant, built: Built, out_model: Path, out_folder: Path | None) -> oracle.Comparison:
    reference, candidate = _runners(mutant, built, out_model, out_folder)
    try:
        want = {o.name: o.type for o in reference.session.get_outputs()}
        got = {o.name: o.type for o in candidate.session.get_outputs()}
        lost = sorted(set(want) - set(got))
        if lost:  # compare() compares the outputs both have: one the rewrite dropped is a wrong rewrite
            return oracle.Comparison(False, float("inf"), f"the output lost graph outputs {lost}", 0)
        retyped = sorted(f"{n}: {want[n]} -> {got[n]}" for n in want if got[n] != want[n])
        if retyped:  # compare() compares values as float64: a graph output's type must not change either
            return oracle.Comparison(False, float("inf"), f"graph outputs changed type: {retyped}", 0)
        config = _config(built.path) if built.path.is_dir() else None
        head = config["model"]["decoder"].get("head_size") if config else None
        tol = 5e-2 if mutant.fp16 else 1e-5
        return oracle.compare(reference, candidate, mutant.calls, head_size=head, atol=tol, rtol=tol)
    finally:
        for runner in (reference, candidate):
            while hasattr(runner, "inner"):
                runner = runner.inner
            close = getattr(runner, "close", None)
            if close is not None:
                close()


# ------------------------------------------------------------------------------------------------------------
# One mutant
# ------------------------------------------------------------------------------------------------------------
def evaluate(mutant: Mutant, tmp: Path) -> Result:
    built = mutant.build(tmp / "mutant")
    folder_input = built.path.is_dir()
    out = tmp / "out" if folder_input else tmp / "out" / built.model_file.name
    run = {"preset": mutant.target} if mutant.target is not None else {"passes": [mutant.pass_name]}
    report = rope_passes.optimize(str(built.path), str(out), options=dict(mutant.options), **run)
    out_folder = out if folder_input else None
    out_model = out / built.model_file.name if folder_input else out
    (pass_report,) = [p for p in report.passes if p.pass_name == mutant.pass_name]
    findings = [f"{f.outcome}: {f.place}: {f.reason}" for f in pass_report.findings
                if f.outcome is not Outcome.NOTE][:6]
    if _rewritten_here(mutant, pass_report, built.places):
        try:
            comparison = _numeric(mutant, built, out_model, out_folder)
        except Exception as exc:  # noqa: BLE001 - an output that cannot even be loaded is a wrong rewrite
            comparison = oracle.Comparison(False, float("inf"), "the output cannot be loaded or run: "
                                           f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", 0)
        outcome = "rewritten-equivalent" if comparison.ok else "REWRITTEN-AND-WRONG"
        if comparison.ok and comparison.calls_run == 0:  # the reference ran no call: the mutant judges nothing
            outcome = "rewritten-unjudged"
        return Result(outcome, comparison.detail, findings)
    names = _graph_names(built.model_file)
    declined = [f for f in pass_report.findings if f.outcome in (Outcome.REFUSED, Outcome.NOT_MATCHED)]
    changed = _untouched(mutant, built, out_model, out_folder)
    if changed is not None:
        return Result("touched-without-finding", changed, findings)
    named = [f for f in declined if _names_a_node(f, names)]
    if not named:
        return Result("refused-without-node", "no refused/not-matched finding names a node of the graph", findings)
    first = named[0]
    return Result("refused", f"{first.outcome}: {first.place}: {first.reason}", findings)


@pytest.fixture(scope="module", autouse=True)
def _table():
    yield
    path = os.environ.get("ROPE_MUTANTS_TABLE")
    if path and RESULTS:
        lines = ["| mutant | class | pass | expected | today | detail |", "|---|---|---|---|---|---|"]
        for m in MUTANTS:
            r = RESULTS.get(m.name)
            if r is None:
                continue
            detail = r["detail"].replace("|", "/").replace("\n", " ")[:220]
            lines.append(f"| {m.name} | {m.cls} | {m.pass_name} | {m.expect} | {r['outcome']} | {detail} |")
        Path(path).write_text("\n".join(lines) + "\n")
        Path(path).with_suffix(".json").write_text(json.dumps(RESULTS, indent=1))


def _params() -> list:
    """One param per mutant: a KNOWN_WRONG one a strict xfail; one judged on the plugin runtime marked ``webgpu``
    (it runs ``.venv-plugin``'s interpreter, tests/conftest.py)."""
    unknown = set(KNOWN_WRONG) - {m.name for m in MUTANTS}
    assert not unknown, f"KNOWN_WRONG names no mutant: {sorted(unknown)}"
    params = []
    for m in MUTANTS:
        marks = [pytest.mark.webgpu] if m.reference == "plugin" else []
        if m.name in KNOWN_WRONG:
            marks.append(pytest.mark.xfail(strict=True, reason=f"known wrong: {KNOWN_WRONG[m.name]}"))
        params.append(pytest.param(m, id=m.name, marks=marks))
    return params


@pytest.mark.corpus
@pytest.mark.parametrize("mutant", _params())
def test_mutant(mutant: Mutant, tmp_path: Path):
    start = time.perf_counter()
    result = evaluate(mutant, tmp_path)
    RESULTS[mutant.name] = {**dataclasses.asdict(result), "expect": mutant.expect, "cls": mutant.cls,
                            "pass": mutant.pass_name, "seconds": round(time.perf_counter() - start, 2)}
    allowed = {REFUSE: ("refused",), EQUIVALENT: ("refused", "rewritten-equivalent")}[mutant.expect]
    assert result.outcome in allowed, (
        f"{mutant.name} ({mutant.why}): expected {' or '.join(allowed)}, got {result.outcome}: {result.detail}\n"
        + "\n".join(result.findings))


# ------------------------------------------------------------------------------------------------------------
# The suite and its references
# ------------------------------------------------------------------------------------------------------------
def test_suite_covers_the_classes():
    assert len(MUTANTS) >= 60
    assert {m.cls for m in MUTANTS} == set(CLASSES)
    assert {m.expect for m in MUTANTS} == {REFUSE, EQUIVALENT}
    passes = {m.pass_name for m in MUTANTS}
    assert passes == set(ALL_PASSES), f"passes without a mutant: {sorted(set(ALL_PASSES) - passes)}"


def _mrope_reference():
    try:
        from oracles import mrope_reference  # tests/oracles.py, where it is moving
    except ImportError:
        from rope_passes.analysis.mrope import mrope_reference
    return mrope_reference


@pytest.mark.parametrize("layout,interleaved,rotary_dim", [(0, False, None), (1, False, 16), (1, True, None)],
                         ids=["sectioned", "interleaved-layout-partial", "interleaved-pairs"])
def test_mrotary_oracle_matches_numpy(layout, interleaved, rotary_dim):
    """The ONNX lowering used as the reference for MRotaryEmbedding graphs equals the NumPy mRoPE oracle, with the
    three axes different (so the section layout matters)."""
    heads, head = 2, 32
    rot = rotary_dim or head
    half = rot // 2
    sections = [half - 2 * (half // 4), half // 4, half // 4]
    rng = np.random.RandomState(1)
    cos, sin = rng.randn(64, half).astype(np.float32), rng.randn(64, half).astype(np.float32)
    x = rng.randn(2, 5, heads * head).astype(np.float32)
    pos = rng.randint(0, 64, size=(3, 2, 5)).astype(np.int64)
    xin = ir.Value(name="x", shape=ir.Shape(["b", "s", heads * head]), type=ir.TensorType(ir.DataType.FLOAT))
    pin = ir.Value(name="pos", shape=ir.Shape([3, "b", "s"]), type=ir.TensorType(ir.DataType.INT64))
    caches = [ir.Value(name=n, shape=ir.Shape(a.shape), type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.tensor(a))
              for n, a in (("cos", cos), ("sin", sin))]
    node = ir.node("MRotaryEmbedding", [xin, pin, *caches], domain="com.microsoft", name="rot", attributes={
        "num_heads": heads, "rotary_embedding_dim": rotary_dim or 0, "interleaved": int(interleaved),
        "mrope_section": sections, "mrope_layout": layout})
    node.outputs[0].name = "y"
    graph = ir.Graph([xin, pin], [node.outputs[0]], nodes=[node], initializers=caches,
                     opset_imports={"": 21, "com.microsoft": 1})
    model = ir.Model(graph, ir_version=10)
    assert oracle.lower_mrotary(model) == 1
    (got,) = oracle.session(oracle.to_bytes(model)).run(None, {"x": x, "pos": pos})
    want = _mrope_reference()(x, pos, cos, sin, sections=sections, layout=layout, num_heads=heads,
                              interleaved=interleaved, rotary_dim=rotary_dim)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.corpus
def test_offset_reference_sees_the_offset(tmp_path):
    """The emulated WebGPU offset is a sound reference: the corpus Phi-3 graph's longrope-concat output with the
    offset equals the If graph on every LongRoPE call; without the offset it does not (past 32)."""
    src = CORPUS / "genai/current/phi3_mini_128k/cpu_fp32"
    out = tmp_path / "out"
    rope_passes.optimize(str(src), str(out), preset="webgpu-graph")
    offset = _config_offset(_config(out))
    assert offset == 32
    head = _config(src)["model"]["decoder"]["head_size"]
    original = oracle.Runner(src / "model.onnx")
    good = oracle.compare(original, oracle.Runner(out / "model.onnx", offset=offset), LONGROPE_CALLS,
                          head_size=head, atol=1e-5, rtol=1e-5)
    assert good.ok and good.calls_run == len(LONGROPE_CALLS), good.detail
    bad = oracle.compare(original, oracle.Runner(out / "model.onnx"), LONGROPE_CALLS, head_size=head,
                         atol=1e-5, rtol=1e-5)
    assert not bad.ok, bad.detail


@pytest.mark.corpus
def test_mrotary_reference_agrees_with_the_fold_on_the_corpus(tmp_path):
    """The unmutated builder 0.18 Qwen2.5-VL graph: fold-text-mrope's output equals the oracle-lowered original,
    so a disagreement on a mutant is the mutant's doing."""
    src = CORPUS / "genai/current/qwen25_vl/cpu_fp32"
    out = tmp_path / "out"
    report = rope_passes.optimize(str(src), str(out), preset="webgpu", options={"text_only": True})
    assert [p.status for p in report.passes if p.pass_name == "fold-text-mrope"] == ["rewritten 2"]
    model = oracle.load_in_memory(src / "model.onnx")
    assert oracle.lower_mrotary(model) == 4
    head = _config(src)["model"]["decoder"]["head_size"]
    result = oracle.compare(oracle.Runner(model), oracle.Runner(out / "model.onnx"), CALLS, head_size=head,
                            atol=1e-5, rtol=1e-5)
    assert result.ok and result.calls_run == len(CALLS), result.detail



@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("small", [False, True], ids=["as-built", "small-qk-default-epsilon"])
def test_qknorm_reference_agrees_with_the_plugin_runtime(small, tmp_path):
    """The q/k-norm lowering the unfuse mutants are judged by equals the fused kernel of the runtime that defines it
    (onnxruntime >= 1.31's WebGPU plugin EP: its CPU EP lacks inputs 14/15) on the corpus Qwen3 fp16 graph; with q/k
    scaled by 1e-3 and no qk_norm_epsilon attribute (so the kernel's default epsilon shows) as well. fp16 bar 5e-2:
    the plugin's WebGPU kernels and 1.27's CPU kernels round differently (measured 0.026 on the builder's own
    unfused graph), an epsilon read wrong moves the small-q/k outputs by whole units."""
    mutant = next(m for m in MUTANTS if m.name == ("unfuse-qwen3-epsilon-absent-small-qk" if small
                                                    else "unfuse-qwen3-as-built"))
    built = mutant.build(tmp_path / "mutant")
    model = oracle.load_in_memory(built.model_file)
    assert qknorm.lower_qk_norm(model) == 2
    reference = plugin_runtime.PluginRunner(built.model_file, ep="webgpu")
    try:
        assert reference.error is None, reference.error
        result = oracle.compare(reference, qknorm.UnfusedRunner(model), ((0, 8, 1), (5, 1, 2)), head_size=32, atol=5e-2,
                                rtol=5e-2)
    finally:
        reference.close()
    assert result.ok and result.calls_run == 2, result.detail
