"""transformers.js as a real client (issue 28): an exporter graph and its ``optimize --target exporter`` output, laid
out as transformers.js loads them, generate the same greedy tokens in transformers.js 4.3.1 (Node), on the CPU and
on WebGPU (onnxruntime-node's WebGPU EP: Dawn on Vulkan, lavapipe on a machine without a GPU).

The graph: the shared corpus's dynamo export of the tiny random llama (``tf5/dynamo/llama/decode.onnx``: hidden 64, 2
layers, vocab 256, max_position_embeddings 256), in a folder with the ``config.json`` its generator used
(``../shared/corpus/torch/rope_variants.py``). What the user does is what the test does: lint the folder (RP501:
the dynamo export names the batch axis ``batch``, which transformers.js sizes 0), see transformers.js fail on it,
repair it with ``lint --fix`` (``name-batch-dim``, metadata only: the graph's nodes and weights stay byte-identical),
then ``optimize`` the folder (``onnx/model.onnx`` rewritten, the ``model_q4f16.onnx`` sibling and the tokenizer
carried byte for byte). One Node process runs the five generations (the WebGPU shader compile is most of it).

Both runtimes come with the full suite's set-up (``scripts/setup-web-runtime.sh``: .web-runtime/node_modules), so
these tests carry ``webgpu`` (the CPU one too: its runtime is set up with the WebGPU runtimes) and ``corpus``; they
fail, never skip, when transformers.js is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TORCH

from rope_passes.cli import main
from rope_passes.lint import lint_bundle
from rope_passes.runtime.web import web_runtime_dir

pytestmark = [pytest.mark.corpus, pytest.mark.webgpu]

SCRIPT = Path(__file__).resolve().parent / "clients" / "transformers_js_generate.mjs"
GRAPH = TORCH / "tf5" / "dynamo" / "llama" / "decode.onnx"
#: rope_variants.py's COMMON + LlamaConfig's defaults (rope_theta 1e4, rms_norm_eps 1e-6): what the graph computes;
#: no eos token, so every generation runs its 16 steps
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 256, "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
          "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None}
PROMPT = [5, 17, 200, 33, 90, 1, 128]
NEW_TOKENS = 16


def _generate(jobs: list[dict]) -> list[dict]:
    modules = web_runtime_dir() / "node_modules" / "@huggingface" / "transformers"
    assert (modules / "package.json").is_file(), (
        f"transformers.js is not set up: {modules} is missing (run scripts/setup-web-runtime.sh; these tests never "
        "skip)")
    assert json.loads((modules / "package.json").read_text())["version"] == "4.3.1"
    for job in jobs:
        job.update(prompt=PROMPT, new_tokens=NEW_TOKENS)
    done = subprocess.run(["node", str(SCRIPT), str(web_runtime_dir()), json.dumps(jobs)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(jobs), done.stdout[-2000:] + done.stderr[-2000:]
    return results


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The exported folder as a user lays it out, a copy repaired with ``lint --fix`` and its optimized output."""
    root = tmp_path_factory.mktemp("tjs")
    exported = root / "exported" / "llama"  # as the exporter left it: `batch`
    (exported / "onnx").mkdir(parents=True)
    shutil.copyfile(GRAPH, exported / "onnx" / "model.onnx")
    shutil.copyfile(GRAPH, exported / "onnx" / "model_q4f16.onnx")  # a sibling: carried, never rewritten
    (exported / "config.json").write_text(json.dumps(CONFIG, indent=1))
    (exported / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {}}}\n')
    repaired = root / "repaired" / "llama"
    shutil.copytree(exported, repaired)
    assert main(["lint", str(repaired), "--fix", "--select", "RP501"]) == 0
    optimized = root / "optimized" / "llama"
    assert main(["optimize", str(repaired), "-o", str(optimized), "--target", "exporter"]) == 0
    return {"exported": exported, "repaired": repaired, "optimized": optimized}


def test_lint_names_the_batch_dim_and_fix_repairs_metadata_only(folders):
    found = [d for d in lint_bundle(folders["exported"]) if d.code == "RP501"]
    assert len(found) == 1 and "'batch'" in found[0].message and found[0].fix == "name-batch-dim"
    assert not [d for d in lint_bundle(GRAPH) if d.code == "RP501"], "a lone .onnx: no client known, no RP501"
    assert not [d for d in lint_bundle(folders["repaired"]) if d.code == "RP501"]
    before = onnx.load(str(GRAPH))
    after = onnx.load(str(folders["repaired"] / "onnx" / "model.onnx"))
    assert before.graph.node == after.graph.node and before.graph.initializer == after.graph.initializer
    batch = [i.type.tensor_type.shape.dim[0].dim_param for i in after.graph.input if i.name.startswith("past_")]
    assert batch == ["batch_size"] * 4
    # the sibling is not the model: lint --fix leaves it as it was
    assert (folders["repaired"] / "onnx" / "model_q4f16.onnx").read_bytes() == GRAPH.read_bytes()


def test_optimize_writes_the_transformers_js_layout(folders):
    out = folders["optimized"]
    ops = {n.op_type for n in onnx.load(str(out / "onnx" / "model.onnx")).graph.node}
    assert not {"Cos", "Sin"} & ops, "precompute-cos-sin did not rewrite the per-call tables"
    for name in ("config.json", "tokenizer.json", "onnx/model_q4f16.onnx"):
        assert (out / name).read_bytes() == (folders["repaired"] / name).read_bytes(), name
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "config.json", "onnx/model.onnx", "onnx/model_q4f16.onnx", "tokenizer.json"]


#: float32 logits of magnitude <= 1.4 here: the precomputed tables hold the per-call cos/sin within a few ulps,
#: which moves the logits by a few ulps of 1.4 (1.2e-7 each) through 2 layers (measured: 0 on the CPU, 4.8e-7 on
#: WebGPU, 6e-7 between the CPU and WebGPU); 1e-5 is ~80 ulps, 450x below the smallest top-1/top-2 margin of the
#: generated rows (0.0045)
LOGIT_TOLERANCE = 1e-5


def test_transformers_js_generates_the_same_tokens_from_the_optimized_folder(folders):
    """The exported folder (fails), the repaired original and the optimized output, on the CPU and on WebGPU; logits
    compared on the CPU. Cost (measured 2026-11-28, an empty Mesa shader cache): lavapipe compiles the shaders of
    each new shape in the first WebGPU generation (~10 s of CPU); the second reuses them from Mesa's cache (~1 s)."""
    def job(kind: str, device: str, logits: bool = False) -> dict:
        return {"root": str(folders[kind].parent), "name": "llama", "device": device, "logits": logits}

    unrepaired, cpu, cpu_opt, gpu, gpu_opt = _generate([
        job("exported", "cpu"), job("repaired", "cpu", True), job("optimized", "cpu", True),
        job("repaired", "webgpu"), job("optimized", "webgpu")])
    # RP501's claim, by the client itself: the `batch` export fails at its first Reshape
    assert "Reshape" in unrepaired.get("error", ""), unrepaired
    for run in (cpu, cpu_opt, gpu, gpu_opt):
        assert "error" not in run, run
    tokens = cpu["tokens"]
    assert len(tokens) == NEW_TOKENS and len(set(tokens)) >= 4, f"tokens trivially constant: {tokens}"
    assert cpu_opt["tokens"] == tokens and gpu["tokens"] == tokens and gpu_opt["tokens"] == tokens
    # logits of one forward pass over the 23 tokens (positions 0..22), original vs optimized
    original, optimized = (np.asarray(run["logits"], np.float32) for run in (cpu, cpu_opt))
    assert original.shape == (len(PROMPT) + NEW_TOKENS, CONFIG["vocab_size"])
    assert np.abs(original - optimized).max() <= LOGIT_TOLERANCE
    # equal tokens mean something: each greedy pick (rows 6..21 chose the 16 tokens) wins by far more than that
    top2 = np.sort(original[len(PROMPT) - 1:-1], axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 100 * LOGIT_TOLERANCE
