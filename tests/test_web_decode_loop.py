"""examples/web_decode_loop.mjs, the decode loop users copy for onnxruntime-web (static GPU KV buffers, the decode
steps graph-captured), run as a user runs it (``loadGenaiFolder`` + ``generate`` on a served genai folder) on both
JavaScript paths: onnxruntime-web's bundle on Dawn for Node and in headless Chromium. The judge is a greedy loop
written here on onnxruntime's CPU EP over the ORIGINAL graph (each present fed back as the next past), not the
checker.

These tests fail, never skip, when the web runtime is not set up (scripts/setup-web-runtime.sh).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import GENAI

from rope_passes.cli import main
from rope_passes.demo import build_tiny_decoder
from rope_passes.runtime import web
from rope_passes.runtime.web.install import CHROMIUM, DAWN

PROMPT = [5, 17, 200, 33, 90, 1, 128]


def greedy_reference(folder: Path, prompt: list[int], new: int) -> list[int]:
    """``new`` greedy tokens after ``prompt`` from the graph in ``folder`` on onnxruntime's CPU EP: a growing KV
    cache (present -> past), a growing all-ones attention mask, position ids where the graph takes them."""
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    kv_dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    past = {n: np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), kv_dtype[i.type])
            for n, i in inputs.items() if n.startswith("past_key_values.")}
    tokens: list[int] = []
    chunk, done = list(prompt), 0
    while len(tokens) < new:
        feeds = {"input_ids": np.array([chunk], np.int64),
                 "attention_mask": np.ones((1, done + len(chunk)), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(done, done + len(chunk), dtype=np.int64)[None]
        out = dict(zip(names, sess.run(None, feeds)))
        tokens.append(int(np.argmax(out["logits"][0, -1])))
        past = {n: out[n.replace("past_key_values.", "present.")] for n in past}
        done += len(chunk)
        chunk = [tokens[-1]]
    return tokens


def generate(b: web.Browser, folder: Path, prompt: list[int], new: int, capture: bool | str = "auto") -> dict:
    """The example's loadGenaiFolder + generate in the page (or in Node), on ``folder`` served as it is."""
    loaded = b.call("loopLoad", {"folder": b.serve_folder(folder), "capture": capture})
    try:
        out = b.call("loopGenerate", {"decoder": loaded["id"], "prompt": prompt, "maxNewTokens": new,
                                      "eosTokenId": -1})
    finally:
        b.call("loopRelease", {"decoder": loaded["id"]})
    return {**loaded, **out}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    """The embedded tiny decoder (fp32: SwiftShader, Chromium's adapter here, has no shader-f16) and its
    ``optimize --preset webgpu-graph --runtime onnxruntime-web`` output (total-seq-on-gpu: capture-ready)."""
    root = tmp_path_factory.mktemp("loop")
    original = build_tiny_decoder(root / "original")
    out = root / "web"
    assert main(["optimize", str(original), "-o", str(out), "--preset", "webgpu-graph",
                 "--runtime", "onnxruntime-web"]) == 0
    return original, out


@pytest.fixture(scope="module")
def browsers():
    """One page per host, started on first use, for the whole module."""
    started: dict[str, web.Browser] = {}

    def get(host: str) -> web.Browser:
        if host not in started:
            why = web.missing(host)
            assert why is None, f"the {host} host is not set up: {why} (these tests never skip)"
            started[host] = web.Browser(host=host)
        return started[host]

    yield get
    for b in started.values():
        b.close()


@pytest.mark.webgpu
@pytest.mark.parametrize("host", [DAWN, CHROMIUM])
def test_captured_loop_gives_the_originals_tokens(browsers, demo, host):
    """24 new tokens (the KV buffers hold 128): prompt uncaptured, step 1 captured, 22 replays; every token the
    original's on the CPU. Greedy picks on this model win by >= 0.0049 (fp32 logits agree to ~1e-6)."""
    original, out = demo
    expected = greedy_reference(original, PROMPT, 24)
    got = generate(browsers(host), out, PROMPT, 24)
    assert got["captured"] is True and got["captureError"] is None, got
    assert got["maxLength"] == 128  # genai_config's search.max_length
    assert got["tokens"] == expected
    assert len(got["stepMs"]) == 23


@pytest.mark.webgpu
def test_uncaptured_loop_on_the_same_buffers_gives_them_too(browsers, demo):
    """capture: false (what a graph that cannot be captured gets): the same static KV buffers, a growing mask (the
    same JavaScript on either host: Dawn for Node only)."""
    original, out = demo
    got = generate(browsers(DAWN), out, PROMPT, 12, capture=False)
    assert got["captured"] is False
    assert got["tokens"] == greedy_reference(original, PROMPT, 12)


@pytest.mark.corpus
@pytest.mark.webgpu
def test_longrope_for_the_browser_decodes_uncaptured_past_the_switch(browsers, tmp_path):
    """Phi-3 128k (corpus: original_max_position 32) optimized for onnxruntime-web keeps its LongRoPE ``If`` (the
    offset a concatenated cache needs is not read there), so onnxruntime-web refuses the capture and the loop
    decodes without it, with the original's tokens across the switch (8-token prompt + 40 new: positions 0..47;
    greedy picks win by >= 0.0053 on the CPU)."""
    src = GENAI / "current/phi3_mini_128k/cpu_fp32"
    out = tmp_path / "web"
    assert main(["optimize", str(src), "-o", str(out), "--preset", "webgpu-graph", "--runtime", "onnxruntime-web"]) == 0
    prompt = [5, 17, 200, 33, 90, 1, 128, 7]
    got = generate(browsers(DAWN), out, prompt, 40)
    assert got["captured"] is False and "control flow" in got["captureError"], got
    assert got["tokens"] == greedy_reference(src, prompt, 40)
