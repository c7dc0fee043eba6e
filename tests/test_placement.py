"""Static placement prediction vs onnxruntime's own placement (runtime probe in a subprocess), on every corpus model.

The probe is the truth: onnxruntime-webgpu 1.27's verbose log (kernel-not-found lines, transformer_memcpy lines, the
session creation error). The prediction must give the same Memcpy set, the same load verdict and the same graph
capture verdict, for all 19 genai corpus models with capture on, and for the models whose placement changes with
capture also with capture off.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import GENAI, UNLOADABLE, genai_models

from rope_passes.analysis.placement import Memcpy, Placement, predict_placement
from rope_passes.analysis.webgpu_kernels import WEBGPU_KERNELS
from rope_passes.runtime.placement_probe import parse_probe_log, probe_placement

MODELS = genai_models()
#: placement differs with capture on/off here (int64 kernels, GQA's CPU-memory total_sequence_length)
CAPTURE_OFF_TOO = ["current/llama/webgpu_fp16", "current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/cpu_fp32",
                   "legacy/qwen25_vl/cpu_fp32"]


@pytest.fixture(scope="module")
def probes(genai_corpus) -> dict[tuple[str, bool], Placement]:
    jobs = [(m, True) for m in MODELS] + [(m, False) for m in CAPTURE_OFF_TOO]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: probe_placement(GENAI / j[0] / "model.onnx", graph_capture=j[1]), jobs))
    return dict(zip(jobs, results))


@pytest.mark.corpus
def test_corpus_has_19_models(genai_corpus):
    assert len(MODELS) == 19


@pytest.mark.corpus
@pytest.mark.webgpu
@pytest.mark.parametrize("capture", [True, False], ids=["capture", "no-capture"])
def test_static_prediction_equals_probe(probes, capture):
    models = MODELS if capture else CAPTURE_OFF_TOO
    mismatches = []
    for rel in models:
        probe = probes[(rel, capture)]
        static = predict_placement(GENAI / rel / "model.onnx", graph_capture=capture)
        if not (static.same_memcpy(probe) and static.loads == probe.loads and static.capture_ok == probe.capture_ok):
            mismatches.append(f"{rel}: static {sorted(static.memcpy_set)} loads={static.loads} "
                              f"capture={static.capture_ok} / probe {sorted(probe.memcpy_set)} loads={probe.loads} "
                              f"capture={probe.capture_ok}")
        if capture and probe.loads:
            # with capture on the EP does no CPU-preference step: CPU nodes = nodes without a kernel (CSE aside)
            assert set(probe.cpu_nodes) <= set(static.cpu_nodes) | set(static.merged_nodes), rel
            assert len(static.cpu_nodes) == len(probe.cpu_nodes), rel
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.corpus
def test_load_failures_are_predicted_with_onnxruntime_reason(probes):
    for rel, why in UNLOADABLE.items():
        probe, static = probes[(rel, True)], predict_placement(GENAI / rel / "model.onnx")
        assert not probe.loads and not static.loads, rel
        key = "MRotaryEmbedding" if "MRotary" in why else "input size 16"
        assert key in probe.load_error and key in static.load_error, (rel, probe.load_error, static.load_error)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_known_corpus_facts(probes):
    """The measured facts the passes rely on, pinned: builder non-_graph graphs need 2 Memcpy for GQA's lengths,
    LongRoPE graphs are refused for control flow, `_graph` builds capture."""
    llama = probes[("current/llama/webgpu_fp16", True)]
    assert llama.memcpy_set == {("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Gather/output_0"),
                                ("MemcpyFromHost", "/model/attn_mask_reformat/attn_mask_subgraph/Sub/output_0")}
    assert llama.capture_ok is False and "partitioned" in llama.capture_error
    phi3 = probes[("current/phi3_mini_128k/cpu_fp32", True)]
    assert phi3.capture_ok is False and "control flow" in phi3.capture_error
    for rel in ("current/llama/webgpu_fp16_graph", "current/phi3_mini_128k/webgpu_fp16_graph"):
        assert probes[(rel, True)].capture_ok and not probes[(rel, True)].memcpy, rel
    # without capture the _graph build's int32 ReduceMax feeds GQA's CPU-memory total_sequence_length: MemcpyToHost
    graph_off = probes[("current/llama/webgpu_fp16_graph", False)]
    assert ("MemcpyToHost", "/model/attn_mask_reformat/attn_mask_subgraph/ReduceMax/output_0") in graph_off.memcpy_set


def test_kernel_table_facts():
    """A few entries of the measured registry that decide corpus placement."""
    assert WEBGPU_KERNELS[("", "Gather", "INT64")] == frozenset()  # no int64 Gather even with capture
    assert WEBGPU_KERNELS[("", "Cast", "INT64->INT32")] == frozenset({"on"})  # int64 Cast only with capture
    assert WEBGPU_KERNELS[("", "ReduceSum", "INT32")] == frozenset({"off", "on"})
    assert WEBGPU_KERNELS[("", "ReduceMax", "INT32")] == frozenset({"off", "on"})
    assert WEBGPU_KERNELS[("", "Shape", "INT64")] == frozenset()


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
