"""Runtime targets (rope_passes.runtimes): the probed tables as data, detection, presets and lint per runtime."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata

import pytest
from conftest import GENAI

from rope_passes.analysis.placement import predict_placement
from rope_passes.cli import main
from rope_passes.errors import UsageError
from rope_passes.io import load_bundle
from rope_passes.lint import lint_bundle
from rope_passes.plan import PRESETS, lint_plan, make_plan, presets_for, runtime_presets, skipped_for
from rope_passes.runtimes.choose import resolve
from rope_passes.runtimes.descriptors import WEBGPU_127, WEBGPU_PLUGIN
from rope_passes.runtimes.installed import RUNTIMES, child_env, default_runtime, detect_installed, python_for
from rope_passes.runtimes.probed import DOWNLEVEL, probed_runtime

QWEN3_FUSED = "current/qwen3/webgpu_fp16"
QWEN25_VL = ["current/qwen25_vl/cpu_fp32", "current/qwen25_vl/webgpu_fp16", "current/qwen25_vl/webgpu_int4_graph"]
#: the load rules: what each runtime can or cannot load
LOAD_RULES = {"RP001", "RP002", "RP003", "RP101"}


# --- the tables as data ------------------------------------------------------------------------------------------


def test_both_tables_load_with_their_probed_facts():
    old, plugin = probed_runtime(WEBGPU_127), probed_runtime(WEBGPU_PLUGIN)
    assert (old.onnxruntime_version, old.plugin_version) == ("1.27.0", None)
    assert (plugin.onnxruntime_version, plugin.plugin_version) == ("1.31.1", "0.4.0")
    assert old.max_ir_version == plugin.max_ir_version == 13
    assert old.gqa_range == (7, 14) and plugin.gqa_range == (7, 16)
    assert not old.loads_op("com.microsoft", "MRotaryEmbedding") and plugin.loads_op("com.microsoft", "MRotaryEmbedding")
    assert "not a registered function/op" in old.op_error("com.microsoft", "MRotaryEmbedding")
    for t in (old, plugin):
        assert t.reads_option("multiRotaryCacheConcatOffset") and t.reads_option("enableGraphCapture")
        assert set(t.capture_blockers) == {"if_node", "shape_to_expand"}
        assert "control flow" in t.capture_blockers["if_node"]
        assert t.knows_op("", "Gelu") and t.knows_op("com.microsoft", "GroupQueryAttention")
        assert t.knows_op("custom.domain", "Anything") is None  # a domain the probe does not cover
    assert old.label == "onnxruntime-webgpu 1.27.0"
    assert plugin.label == "onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0"
    assert json.dumps(old.to_dict()) and old.summary().startswith("onnxruntime-webgpu 1.27.0: IR ≤ 13")


def test_unknown_runtime_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown runtime 'onnxruntime-cuda'"):
        probed_runtime("onnxruntime-cuda")


def test_downlevel_passes_are_needed_where_the_probe_says():
    old, plugin = probed_runtime(WEBGPU_127), probed_runtime(WEBGPU_PLUGIN)
    assert set(DOWNLEVEL) == {"lower-mrope", "unfuse-gqa-qk-norm"}
    assert "7..14 inputs only" in old.needs("unfuse-gqa-qk-norm")
    assert "MRotaryEmbedding is not registered" in old.needs("lower-mrope")
    assert plugin.needs("unfuse-gqa-qk-norm") is None and plugin.needs("lower-mrope") is None
    assert old.skip_reason("lower-mrope") is None and "not needed" in plugin.skip_reason("lower-mrope")
    assert old.needs("cleanup") is None and plugin.skip_reason("cleanup") is None  # not downlevel passes


# --- what is installed ----------------------------------------------------------------------------------------------


def test_detect_installed_reads_package_metadata(monkeypatch):
    installed = detect_installed()
    assert installed is not None and installed.runtime == WEBGPU_127  # this venv: onnxruntime-webgpu
    assert default_runtime() == WEBGPU_127 and resolve(None).name == WEBGPU_127

    def fake(versions):
        def version(dist):
            if dist in versions:
                return versions[dist]
            raise metadata.PackageNotFoundError(dist)
        return version

    try:
        monkeypatch.setattr(metadata, "version", fake({"onnxruntime": "1.31.1", "onnxruntime-ep-webgpu": "0.4.0"}))
        detect_installed.cache_clear()
        got = detect_installed()
        assert got is not None and got.runtime == WEBGPU_PLUGIN and got.label.startswith("onnxruntime 1.31.1 +")
        monkeypatch.setattr(metadata, "version", fake({"onnxruntime": "1.31.1"}))  # no plugin: no WebGPU at all
        detect_installed.cache_clear()
        assert detect_installed() is None and default_runtime() == WEBGPU_127  # rope-passes' own dependency
    finally:
        detect_installed.cache_clear()


@pytest.mark.webgpu  # runs .venv-plugin's interpreter (the second WebGPU runtime)
def test_the_plugin_venv_detects_itself():
    """In .venv-plugin (onnxruntime + onnxruntime-ep-webgpu) detection says so, without a session. CI installs it."""
    python = python_for(WEBGPU_PLUGIN)
    assert python is not None, "no .venv-plugin: run scripts/setup.sh --with-plugin-runtime (CI installs it)"
    code = ("from rope_passes.runtimes.installed import detect_installed, default_runtime; "
            "from rope_passes.runtime.sessions import uses_plugin; "
            "print(detect_installed().runtime, default_runtime(), uses_plugin())")
    out = subprocess.run([python, "-c", code], env=child_env(WEBGPU_PLUGIN), capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [WEBGPU_PLUGIN, WEBGPU_PLUGIN, "True"]


# --- presets per runtime --------------------------------------------------------------------------------------------


def test_presets_per_runtime():
    old, plugin = presets_for(WEBGPU_127), presets_for(WEBGPU_PLUGIN)
    assert old == PRESETS  # 1.27 needs every downlevel pass
    assert plugin["webgpu"] == ["fold-text-mrope", "annotate-cache-offset", "cleanup"]
    assert plugin["webgpu-graph"] == ["fold-text-mrope", "longrope-concat", "annotate-cache-offset",
                                      "total-seq-on-gpu", "narrow-int64", "cleanup"]
    assert plugin["exporter"] == old["exporter"]
    assert runtime_presets() == {WEBGPU_127: old, WEBGPU_PLUGIN: plugin}
    assert list(make_plan("webgpu", runtime=WEBGPU_PLUGIN).passes) == plugin["webgpu"]
    assert make_plan(passes=["unfuse-gqa-qk-norm"], runtime=WEBGPU_PLUGIN).passes == ("unfuse-gqa-qk-norm",)  # as given
    assert skipped_for("webgpu-graph", WEBGPU_127) == {}
    assert set(skipped_for("webgpu-graph", WEBGPU_PLUGIN)) == {"unfuse-gqa-qk-norm", "lower-mrope"}
    for names in PRESETS.values():  # downlevel passes come first: later passes read the standard form
        downlevel = [i for i, n in enumerate(names) if n in DOWNLEVEL]
        assert downlevel == list(range(len(downlevel))) or names[downlevel[-1] - 1] == "fold-text-mrope"


def test_passes_command_shows_presets_per_runtime(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert f"--runtime {WEBGPU_127} (installed: the default)" in out and f"--runtime {WEBGPU_PLUGIN}:" in out
    assert "unfuse-gqa-qk-norm left out: not needed" in out


# --- load rules and placement per runtime --------------------------------------------------------------------------


@pytest.mark.corpus
def test_load_problems_per_runtime(genai_corpus):
    model = load_bundle(GENAI / QWEN3_FUSED).model
    problems = probed_runtime(WEBGPU_127).load_problems(model)
    assert {p.kind for p in problems} == {"gqa-inputs"} and len(problems) == 2
    assert "input size 16 not in range [min=7, max=14]" in problems[0].message
    assert probed_runtime(WEBGPU_PLUGIN).load_problems(model) == []
    assert probed_runtime(WEBGPU_127).downlevel_for(model) == {"unfuse-gqa-qk-norm": problems[0].message}
    assert probed_runtime(WEBGPU_PLUGIN).downlevel_for(model) == {}
    assert not predict_placement(model, runtime=WEBGPU_127).loads and predict_placement(model, runtime=WEBGPU_PLUGIN).loads


@pytest.mark.corpus
def test_lint_qwen3_fused_on_127_is_rp002(genai_corpus):
    codes = {d.code for d in lint_bundle(GENAI / QWEN3_FUSED, lint_plan(runtime=WEBGPU_127))}
    assert codes & LOAD_RULES == {"RP002"}
    found = [d for d in lint_bundle(GENAI / QWEN3_FUSED, lint_plan(runtime=WEBGPU_127)) if d.code == "RP002"]
    assert "16 inputs (onnxruntime-webgpu 1.27.0 accepts 7..14)" in found[0].message
    assert found[0].fix == "unfuse-gqa-qk-norm"


@pytest.mark.corpus
def test_lint_qwen3_fused_on_plugin_loads(genai_corpus):
    assert not {d.code for d in lint_bundle(GENAI / QWEN3_FUSED, lint_plan(runtime=WEBGPU_PLUGIN))} & LOAD_RULES


@pytest.mark.corpus
@pytest.mark.parametrize("rel", QWEN25_VL)
def test_lint_qwen25_vl_on_127_is_rp101(genai_corpus, rel):
    diags = lint_bundle(GENAI / rel, lint_plan(runtime=WEBGPU_127))
    assert {d.code for d in diags} & LOAD_RULES == {"RP101"}
    assert all("not registered in onnxruntime-webgpu 1.27.0" in d.message for d in diags if d.code == "RP101")
    assert len([d for d in diags if d.code == "RP101"]) == 4  # q and k of both layers


@pytest.mark.corpus
@pytest.mark.parametrize("rel", QWEN25_VL)
def test_lint_qwen25_vl_on_plugin_loads(genai_corpus, rel):
    assert not {d.code for d in lint_bundle(GENAI / rel, lint_plan(runtime=WEBGPU_PLUGIN))} & LOAD_RULES


@pytest.mark.corpus
def test_lint_cli_runtime_flag(genai_corpus, capsys):
    assert main(["lint", "--runtime", WEBGPU_PLUGIN, "--select", "RP002,RP101", str(GENAI / QWEN3_FUSED)]) == 0
    assert capsys.readouterr().out.strip() == "0 problems in 1 model"
    assert main(["lint", "--runtime", WEBGPU_127, "--select", "RP002", str(GENAI / QWEN3_FUSED)]) == 1
    assert "RP002" in capsys.readouterr().out


@pytest.mark.corpus
def test_inspect_says_what_each_runtime_does(genai_corpus, capsys):
    assert main(["inspect", "--json", str(GENAI / QWEN3_FUSED)]) == 0
    verdicts = {v["runtime"]: v for v in json.loads(capsys.readouterr().out)["runtimes"]}
    assert set(verdicts) == set(RUNTIMES)
    assert not verdicts[WEBGPU_127]["loads"] and verdicts[WEBGPU_127]["downlevel"] == ["unfuse-gqa-qk-norm"]
    assert verdicts[WEBGPU_127]["installed"]
    plugin = verdicts[WEBGPU_PLUGIN]
    assert plugin["loads"] and not plugin["capture_ready"] and plugin["verdict"].startswith("loads; capture blocked by 2")
    assert main(["inspect", "--runtime", WEBGPU_PLUGIN, str(GENAI / "current/qwen25_vl/webgpu_int4_graph")]) == 0
    out = capsys.readouterr().out
    # a prediction from the probed table, for a runtime not installed in this environment: both said (issue 32)
    assert "onnxruntime-ep-webgpu 0.4.0 (not installed), predicted: loads; capture-ready" in out, out
    assert "1.27.0" not in out
    assert main(["inspect", "--runtime", WEBGPU_127, str(GENAI / "current/qwen25_vl/webgpu_int4_graph")]) == 0
    assert "onnxruntime-webgpu 1.27.0 (installed), predicted: " in capsys.readouterr().out


@pytest.mark.corpus
def test_optimize_cli_says_which_runtime(genai_corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["optimize", str(GENAI / QWEN3_FUSED), "-o", str(out), "--runtime", WEBGPU_PLUGIN]) == 0
    text = capsys.readouterr().out
    assert "output for onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0 (--runtime)" in text
    assert "unfuse-gqa-qk-norm skipped: not needed" in text
    assert main(["optimize", str(GENAI / QWEN3_FUSED), "-o", str(tmp_path / "o2"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == WEBGPU_127 and report["skipped"] == {}


# --- attributes: the runtime's own op schemas ----------------------------------------------------------------------


def _gqa_with(attribute: str) -> bytes:
    """A one-node GroupQueryAttention graph with ``attribute`` set (7 inputs, fp32)."""
    from onnx import TensorProto, helper

    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tl"], ["o", "pko", "pvo"],
                            "gqa", domain="com.microsoft", num_heads=2, kv_num_heads=2, **{attribute: 16})
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, [1, 1, 32]) for n in "qkv"]
    ins += [helper.make_tensor_value_info(n, f, [1, 2, 0, 16]) for n in ("pk", "pv")]
    ins += [helper.make_tensor_value_info("sl", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("tl", TensorProto.INT32, [])]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("o", "pko", "pvo")]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_attribute_the_schema_lacks_does_not_load(runtime):
    """A Nemotron-style GroupQueryAttention with ``rotary_embedding_dim`` (mobius-onnx writes it): both onnxruntimes
    refuse it ("Unrecognized attribute"), so every command must say "does not load" (before: "loads")."""
    import onnx
    import onnx_ir as ir

    model = ir.from_proto(onnx.load_from_string(_gqa_with("rotary_embedding_dim")))
    [problem] = probed_runtime(runtime).load_problems(model)
    assert problem.kind == "unknown-attribute" and problem.place == "gqa"
    assert problem.message.endswith("Unrecognized attribute: rotary_embedding_dim for operator GroupQueryAttention")
    assert predict_placement(model, runtime=runtime).verdict().startswith("does not load")
    assert probed_runtime(runtime).load_problems(ir.from_proto(onnx.load_from_string(_gqa_with("local_window_size")))) == []


@pytest.mark.webgpu
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_onnxruntime_is_the_judge_of_attributes(runtime, tmp_path):
    """What the schemas predict is what session creation does, on each runtime's own interpreter."""
    from rope_passes.runtime.placement_probe import probe_placement

    for attribute, loads in (("rotary_embedding_dim", False), ("local_window_size", True)):
        path = tmp_path / f"{attribute}.onnx"
        path.write_bytes(_gqa_with(attribute))
        probe = probe_placement(path, graph_capture=False, runtime=runtime)
        assert probe.loads == loads, probe.load_error
        if not loads:
            assert "Unrecognized attribute: rotary_embedding_dim" in (probe.load_error or "")


def test_offset_passes_skipped_where_the_runtime_does_not_read_the_offset():
    """onnxruntime-web 1.30's probe shows multiRotaryCacheConcatOffset has no effect (runtime_tables/onnxruntime-web.json):
    a preset for it leaves out the passes whose rewrite needs the offset read; the Python runtimes read it."""
    from rope_passes.plan import presets_for, skipped_for
    from rope_passes.runtimes.descriptors import WEB
    from rope_passes.runtimes.installed import RUNTIMES
    from rope_passes.runtimes.probed import OPTION_PASSES, probed_runtime

    web = probed_runtime(WEB)
    assert not web.reads_option("multiRotaryCacheConcatOffset")
    assert set(OPTION_PASSES) == {"longrope-concat", "annotate-cache-offset"}
    for target in ("webgpu", "webgpu-graph"):
        assert not set(OPTION_PASSES) & set(presets_for(WEB)[target])
        skipped = skipped_for(target, WEB)
        assert all("does not read multiRotaryCacheConcatOffset" in skipped[n] for n in OPTION_PASSES if n in skipped)
        assert "annotate-cache-offset" in skipped
    for name in RUNTIMES:
        assert probed_runtime(name).reads_option("multiRotaryCacheConcatOffset")
        assert "longrope-concat" in presets_for(name)["webgpu-graph"]


def test_a_pass_measured_not_exact_on_a_runtime_is_left_out_for_it():
    """fold-text-mrope is not exact on onnxruntime-web 1.30 (measured, tests/test_web_runtime.py): its presets leave
    it out with the reason; the Python runtimes keep it."""
    from rope_passes.plan import presets_for, skipped_for
    from rope_passes.runtimes.descriptors import WEB
    from rope_passes.runtimes.installed import RUNTIMES
    from rope_passes.runtimes.probed import INEXACT_PASSES

    assert set(INEXACT_PASSES) == {WEB} and set(INEXACT_PASSES[WEB]) == {"fold-text-mrope"}
    assert "fold-text-mrope" not in presets_for(WEB)["webgpu-graph"]
    assert "not exact on onnxruntime-web" in skipped_for("webgpu-graph", WEB)["fold-text-mrope"]
    for name in RUNTIMES:
        assert "fold-text-mrope" in presets_for(name)["webgpu-graph"]


def test_an_option_of_a_pass_the_runtime_leaves_out_is_no_error(tmp_path):
    """``--text-only`` is fold-text-mrope's option, which the browser's preset leaves out: the option is right for the
    target, so the run goes on and says the pass was skipped (before: "option 'text_only' is not taken by any pass of
    this run"); an option no pass of the preset takes is still an error."""
    from rope_passes.demo import build_tiny_decoder
    from rope_passes.io import load_bundle
    from rope_passes.pipeline import run_pipeline
    from rope_passes.plan import make_plan
    from rope_passes.runtimes.descriptors import WEB

    src = build_tiny_decoder(tmp_path / "demo")
    report = run_pipeline(load_bundle(src), make_plan(preset="webgpu-graph", options={"text_only": True}, runtime=WEB))
    assert "fold-text-mrope" in report.skipped and "fold-text-mrope" not in [p.pass_name for p in report.passes]
    with pytest.raises(UsageError, match="option 'text_onyl' is not taken"):
        make_plan(preset="webgpu-graph", options={"text_onyl": True}, runtime=WEB)
