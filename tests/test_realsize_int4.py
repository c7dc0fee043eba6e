"""int4 at real size (issue 31): bench/realsize.py's builder int4 graphs (MatMulNBits, block 32, as onnxruntime-genai
0.18 writes them for ``-p int4 -e webgpu``, with and without ``enable_webgpu_graph``).

* the int4 form is the builder's: :func:`realsize.quantize_int4` on the corpus's fp16 qwen25_vl build gives the
  MatMulNBits nodes and initializers of the builder's own int4 build of the same checkpoint, field for field;
* at 2 layers (the corpus's tiny widths, random weights of a fresh checkpoint's size), ``optimize --preset
  webgpu-graph`` then ``check`` is equivalent for each family (fold, LongRoPE concat, total-seq-on-gpu);
* at real size, a dry run rewrites with the same passes, the same number of times, as for the fp16 twin, and reads no
  weight (only the RoPE tables, which the proofs need).
Budget (2 cores, CI): the checks ~25 s each on lavapipe, the real-size dry runs ~20 s together.
"""

from __future__ import annotations

import dataclasses
import re

import onnx
import onnx_ir as ir
import pytest
from _utils import realsize
from conftest import GENAI

import rope_passes
from rope_passes.check.core import EQUIVALENT, check

pytestmark = pytest.mark.corpus

INT4 = [name for name, spec in realsize().MODELS.items() if spec.int4]
#: one per rewrite the int4 forms need: the fold (manual mRoPE; MRotaryEmbedding from the builder's own int4
#: graph), LongRoPE concat, total-seq-on-gpu (a mask read through Shape)
CHECKED = ["qwen25vl-3b-legacy-int4", "qwen25vl-3b-graph-int4", "phi3-mini-128k-graph-int4", "llama3-8b-int4"]


def _matmulnbits(model: onnx.ModelProto) -> tuple[list, list]:
    nodes = [(n.name, list(n.input), list(n.output), n.domain,
              [(a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute])
             for n in model.graph.node if n.op_type == "MatMulNBits"]
    inits = sorted((i.name, list(i.dims), i.data_type) for i in model.graph.initializer if ".MatMul." in i.name)
    return nodes, inits


def test_int4_form_is_what_the_builder_writes():
    fp16 = onnx.load(str(GENAI / "current/qwen25_vl/webgpu_fp16/model.onnx"), load_external_data=False)
    builder = onnx.load(str(GENAI / "current/qwen25_vl/webgpu_int4_graph/model.onnx"), load_external_data=False)
    ours = realsize().quantize_int4(fp16)
    nodes, inits = _matmulnbits(ours)
    assert len(nodes) == 15 and (nodes, inits) == _matmulnbits(builder)
    assert not any(n.op_type == "MatMul" for n in ours.graph.node)
    assert ("com.microsoft", 1) in {(o.domain, o.version) for o in ours.opset_import}


def test_every_int4_model_has_its_layers_as_matmulnbits(tmp_path):
    rs = realsize()
    for name in INT4:
        folder = rs.build(name, tmp_path / name, layers=3, context=256)
        ops = rs.op_histogram(folder / "model.onnx")
        cfg = rs.CONFIGS[rs.MODELS[name].config]
        m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        per_layer = sum(i.name.startswith("model.layers.2.") and i.name.endswith("_Q4") for i in m.graph.initializer)
        assert per_layer >= 4 and ops.get("com.microsoft::MatMulNBits") == 3 * per_layer + 1, (name, ops)
        assert not [i.name for i in m.graph.initializer if i.name.endswith(".MatMul.weight")], name
        lm = next(n for n in m.graph.node if n.name == "/lm_head/MatMul_Q4")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in lm.attribute}
        assert (attrs["K"], attrs["N"], attrs["block_size"], attrs["bits"]) == (cfg.hidden, cfg.vocab, 32, 4)
        q4 = next(i for i in m.graph.initializer if i.name == "lm_head.MatMul.weight_Q4")
        assert list(q4.dims) == [cfg.vocab, cfg.hidden // 32, 16]
        rs.check(folder)


@pytest.mark.webgpu
@pytest.mark.parametrize("name", CHECKED)
def test_int4_two_layers_optimize_and_check_equivalent(name, tmp_path):
    rs = realsize()
    spec = rs.MODELS[name]
    cfg = dataclasses.replace(rs.tiny_config(GENAI / spec.source), layers=2)
    src = rs.build(name, tmp_path / "src", config=cfg, corpus=GENAI, seed=0)
    options = {"text_only": True} if "qwen" in name else None
    report = rope_passes.optimize(src, tmp_path / "out", preset="webgpu-graph", options=options, weights="copy")
    assert report.capture is not None and report.capture["state"] == "ready", report.capture
    assert [p.pass_name for p in report.passes if p.modified], name
    result = check(src, tmp_path / "out")
    assert result.verdict == EQUIVALENT, (name, result.reason, [str(c) for c in result.comparisons if not c.passed])


def _rewrites(report) -> dict[str, int]:
    return {p.pass_name: sum(f.outcome.name == "REWRITTEN" for f in p.findings) for p in report.passes if p.modified}


def test_int4_real_size_dry_run_rewrites_like_fp16_without_reading_weights(tmp_path, monkeypatch):
    rs = realsize()
    read: list[str] = []
    load = ir.ExternalTensor._load

    def spy(self):
        read.append(self.name)
        return load(self)

    monkeypatch.setattr(ir.ExternalTensor, "_load", spy)
    rewritten: list[str] = []
    for name, twin in rs.FP16_OF.items():
        options = {"text_only": True} if "qwen" in name else None
        done = {}
        for model in (name, twin):
            folder = rs.build(model, tmp_path / model)
            assert rs.CONFIGS[rs.MODELS[model].config].layers >= 28
            done[model] = _rewrites(rope_passes.optimize(folder, None, preset="webgpu-graph", options=options,
                                                         dry_run=True))
        assert done[name] == done[twin], (name, done)
        if done[name]:
            rewritten.append(name)
    assert set(rewritten) == set(rs.FP16_OF) - {"llama3-8b-graph-int4"}  # enable_webgpu_graph llama: capture-ready
    weights = [n for n in read if re.search(r"MatMul\.weight|embed_tokens|lm_head", n)]
    assert not weights, weights[:5]
    assert {"cos_cache", "sin_cache"} <= set(read)  # the spy sees what the proofs read
