"""Static placement prediction vs onnxruntime's own placement (runtime probe in a subprocess), on both WebGPU runtimes.

The probe is the truth: the runtime's verbose log (kernel-not-found lines, transformer_memcpy lines, the session
creation error), on onnxruntime-webgpu 1.27 (this venv) and on onnxruntime 1.31 + the WebGPU plugin EP (the
``.venv-plugin`` interpreter; CI installs it, and a missing one fails these tests, never skips them). The prediction,
from the target's probed kernel table (``rope_passes/runtime_tables``), must give the same Memcpy set, the same load
verdict and the same graph capture verdict for all 19 genai corpus models and every builder fixture (phi2 and gemma
with ``Gelu``, llama31, qwen2, ...) with capture on, and for the models whose placement changes with capture also
with capture off.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURES, GENAI, UNLOADABLE, genai_models

from rope_passes.analysis.placement import Memcpy, Placement, predict_placement
from rope_passes.runtime.placement_probe import parse_probe_log, probe_placement
from rope_passes.runtimes.descriptors import WEBGPU_127, WEBGPU_PLUGIN
from rope_passes.runtimes.installed import RUNTIMES
from rope_passes.runtimes.probed import probed_runtime

MODELS = genai_models()
#: builder 0.18 families and options beyond the shared corpus (tests/fixtures/README.md)
FIXTURE_MODELS = sorted(str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("genai/*/*/model.onnx"))
#: placement differs with capture on/off here (int64 kernels, GQA's CPU-memory total_sequence_length)
CAPTURE_OFF_TOO = ["current/llama/webgpu_fp16", "current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/cpu_fp32",
                   "legacy/qwen25_vl/cpu_fp32"]
#: what does not load on each runtime (the plugin loads every corpus model)
UNLOADABLE_ON = {WEBGPU_127: UNLOADABLE, WEBGPU_PLUGIN: {}}


def _path(rel: str) -> Path:
    return (FIXTURES / rel if rel.startswith("genai/") else GENAI / rel) / "model.onnx"


@pytest.fixture(scope="module")
def probes(genai_corpus) -> dict[tuple[str, str, bool], Placement]:
    jobs = [(r, m, True) for r in RUNTIMES for m in MODELS + FIXTURE_MODELS]
    jobs += [(r, m, False) for r in RUNTIMES for m in CAPTURE_OFF_TOO]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: probe_placement(_path(j[1]), graph_capture=j[2], runtime=j[0]), jobs))
    return dict(zip(jobs, results))


@pytest.mark.corpus
def test_corpus_has_19_models(genai_corpus):
    assert len(MODELS) == 19


@pytest.mark.corpus
def test_fixture_families_are_there():
    families = {rel.split("/")[1] for rel in FIXTURE_MODELS}
    assert {"phi2", "gemma", "llama31", "qwen2"} <= families, families


def _mismatches(probes, runtime: str, models: list[str], capture: bool) -> list[str]:
    out = []
    for rel in models:
        probe = probes[(runtime, rel, capture)]
        static = predict_placement(_path(rel), graph_capture=capture, runtime=runtime)
        if not (static.same_memcpy(probe) and static.loads == probe.loads and static.capture_ok == probe.capture_ok):
            out.append(f"{runtime} {rel}: static {sorted(static.memcpy_set)} loads={static.loads} "
                       f"capture={static.capture_ok} / probe {sorted(probe.memcpy_set)} loads={probe.loads} "
                       f"capture={probe.capture_ok}")
        elif capture and probe.loads:
            # with capture on the EP does no CPU-preference step: CPU nodes = nodes without a kernel (CSE aside)
            cpu_ok = (set(probe.cpu_nodes) <= set(static.cpu_nodes) | set(static.merged_nodes)
                      and len(static.cpu_nodes) == len(probe.cpu_nodes))
            if not cpu_ok:
                out.append(f"{runtime} {rel}: CPU nodes static {sorted(static.cpu_nodes)} / probe {sorted(probe.cpu_nodes)}")
    return out


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("capture", [True, False], ids=["capture", "no-capture"])
def test_static_prediction_equals_probe(probes, runtime, capture):
    mismatches = _mismatches(probes, runtime, MODELS if capture else CAPTURE_OFF_TOO, capture)
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_builder_fixtures_static_equals_probe(probes, runtime):
    """Families beyond the shared corpus, capture on: no Memcpy predicted where onnxruntime inserts none (phi2 and
    gemma's ``Gelu(approximate="tanh")`` has a WebGPU kernel: no RP205 false positive)."""
    mismatches = _mismatches(probes, runtime, FIXTURE_MODELS, True)
    assert not mismatches, "\n".join(mismatches)
    for rel in FIXTURE_MODELS:
        if rel.endswith("_graph") or "_graph_" in rel:
            probe = probes[(runtime, rel, True)]
            if probe.loads:
                assert probe.capture_ok and not probe.memcpy, (runtime, rel, probe.summary())


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_load_failures_are_predicted_with_onnxruntime_reason(probes, runtime):
    for rel in MODELS:
        probe, static = probes[(runtime, rel, True)], predict_placement(_path(rel), runtime=runtime)
        why = UNLOADABLE_ON[runtime].get(rel)
        assert probe.loads is (why is None) and static.loads is (why is None), (runtime, rel, probe.load_error)
        if why is not None:
            key = "MRotaryEmbedding" if "MRotary" in why else "input size 16"
            assert key in probe.load_error and key in static.load_error, (rel, probe.load_error, static.load_error)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_known_corpus_facts(probes):
    """The measured facts the passes rely on, pinned: builder non-_graph graphs need 2 Memcpy for GQA's lengths,
    LongRoPE graphs are refused for control flow, `_graph` builds capture."""
    llama = probes[(WEBGPU_127, "current/llama/webgpu_fp16", True)]
    assert llama.memcpy_set == {("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Gather/output_0"),
                                ("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Sub/output_0")}
    assert llama.capture_ok is False and "partitioned" in llama.capture_error
    phi3 = probes[(WEBGPU_127, "current/phi3_mini_128k/cpu_fp32", True)]
    assert phi3.capture_ok is False and "control flow" in phi3.capture_error
    for rel in ("current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/webgpu_fp16_graph"):
        for runtime in RUNTIMES:
            assert probes[(runtime, rel, True)].capture_ok and not probes[(runtime, rel, True)].memcpy, rel
    # without capture the _graph build's int32 ReduceMax feeds GQA's CPU-memory total_sequence_length: MemcpyToHost
    graph_off = probes[(WEBGPU_127, "current/llama/webgpu_fp16_graph", False)]
    assert ("MemcpyToHost", "/model/attn_mask_reformat/attn_mask_subgraph/ReduceMax/output_0") in graph_off.memcpy_set


@pytest.mark.corpus
@pytest.mark.webgpu
def test_plugin_facts(probes):
    """The plugin's int64 kernels under capture (Gather among them) move Shape math to the GPU: Shape's output is
    copied up instead of the Gather's; current VL `_graph` builds (MRotaryEmbedding) load and capture there."""
    llama = probes[(WEBGPU_PLUGIN, "current/llama/webgpu_fp16", True)]
    assert ("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Shape/output_0") in llama.memcpy_set
    assert llama.capture_ok is False and len(llama.cpu_nodes) < len(probes[(WEBGPU_127, "current/llama/webgpu_fp16",
                                                                            True)].cpu_nodes)
    for rel in ("current/qwen25_vl/webgpu_int4_graph", "current/qwen35/webgpu_fp16_graph"):
        assert probes[(WEBGPU_PLUGIN, rel, True)].capture_ok, rel


def test_kernel_table_facts():
    """A few entries of the probed registries that decide corpus placement (opset 22, as the builder writes)."""
    k127, plugin = probed_runtime(WEBGPU_127).kernels, probed_runtime(WEBGPU_PLUGIN).kernels
    assert k127.modes("", "Gather", "INT64", 22) == frozenset()  # no int64 Gather even with capture
    assert plugin.modes("", "Gather", "INT64", 22) == frozenset({"on"})  # the plugin has one under capture
    assert k127.modes("", "Cast", "INT64->INT32", 22) == frozenset({"on"})  # int64 Cast only with capture
    assert k127.modes("", "ReduceSum", "INT32", 22) == frozenset({"off", "on"})
    assert k127.modes("", "ReduceMax", "INT32", 22) == frozenset({"off", "on"})
    assert k127.modes("", "Shape", "INT64", 22) == frozenset()
    assert k127.modes("", "Gelu", "FLOAT", 22) == frozenset({"off", "on"})  # builder 0.18's "FastGelu"
    assert k127.modes("", "If", "BOOL", 22) == frozenset({"off", "on"})  # capture mode unmeasured: as without
    assert k127.modes("com.microsoft", "MRotaryEmbedding", "FLOAT") is None  # not registered at all
    assert plugin.modes("com.microsoft", "MRotaryEmbedding", "FLOAT") == frozenset({"off", "on"})
    # a schema newer than the base opset: RotaryEmbedding-23 (ONNX domain) only from opset 23
    assert k127.modes("", "RotaryEmbedding", "FLOAT", 23) == frozenset({"off", "on"})
    assert k127.modes("", "RotaryEmbedding", "FLOAT", 22) is None  # no such ONNX op at opset 22
    assert k127.modes("", "RotaryEmbedding", "FLOAT") == frozenset({"off", "on"})  # opset unknown: the newer one
    assert k127.modes("", "Softplus", "FLOAT", 21) == frozenset({"off", "on"})


def test_memcpy_names_any_cse_alias():
    a = Placement("m", True, "static", memcpy=[Memcpy("MemcpyFromHost", "cos/x", aliases=("sin/x",))])
    b = Placement("m", True, "probe", memcpy=[Memcpy("MemcpyFromHost", "sin/x")])
    c = Placement("m", True, "probe", memcpy=[Memcpy("MemcpyToHost", "sin/x")])
    assert a.same_memcpy(b) and not a.same_memcpy(c)


def test_probe_log_parsing():
    log = '2026 [I:onnxruntime:, webgpu_execution_provider.cc:635 GetCapability] webgpu kernel not found in registries for Op type: Shape node name: /m/Shape\n2026 [I:onnxruntime:, transformer_memcpy.cc:393 AddCopyNode] Add MemcpyFromHost after /m/Gather/output_0 for WebGpuExecutionProvider\nROPE_PASSES_PROBE {"error": "[ONNXRuntimeError] : 1 : FAIL : This session cannot use the graph capture feature as requested", "providers": null}'
    p = parse_probe_log("m", True, log)
    assert p.loads and p.capture_ok is False and p.capture_error.startswith("This session cannot use the graph")
    assert p.memcpy_set == {("MemcpyFromHost", "/m/Gather/output_0")} and list(p.cpu_nodes) == ["/m/Shape"]
    crashed = parse_probe_log("m", True, "Segmentation fault", returncode=-11)
    assert not crashed.loads and "exit code -11" in crashed.load_error
