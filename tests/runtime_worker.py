"""The session side of the per-runtime corpus tests, run on either WebGPU runtime's interpreter:

    <python of the runtime> tests/runtime_worker.py JOB.json OUT_DIR

(``.venv/bin/python`` for onnxruntime-webgpu 1.27, ``.venv-plugin/bin/python`` for onnxruntime 1.31 + the WebGPU
plugin EP; this repository on ``PYTHONPATH``: :func:`rope_passes.runtimes.installed.child_env`). It needs numpy,
onnx and onnxruntime only, so it runs in the plugin venv, which has no rope-passes installed.

JOB.json: ``{"model": path, "genai_config": {...} | null, "webgpu_options": {key: value}, "embedding": .npy | null,
"prefill": 8, "total": 8 | 44, "ep": "webgpu" | "cpu"}``. One session on ``ep`` (default WebGPU;
``create_session``: no silent CPU fallback), a prefill of
``prefill`` tokens of the corpus's reference sequence (:func:`rope_passes.check.decode.token_ids`), then single-token
steps up to ``total`` tokens. OUT_DIR gets ``prefill.npy`` (the prefill's logits ``[S, vocab]``, float32),
``last.npy`` (the last position's logits after each call: ``[1 + total - prefill, vocab]``, row k after
``prefill + k`` tokens, as the corpus's ``ref_long.npy``) and ``result.json`` (``runtime``, ``providers``, ``error``).

:func:`run_worker` is the tests' side: it writes the job, runs this script on the runtime's interpreter and reads
the results back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np


def run_worker(runtime: str, model: Path, work: Path, *, total: int = 8, ep: str = "webgpu",
               embedding: str | None = None) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """The session side on ``runtime``'s interpreter (tests/runtime_worker.py): result.json, prefill and last rows."""
    from rope_passes.config import GenaiConfig
    from rope_passes.runtimes.installed import child_env, python_for

    python = python_for(runtime)
    assert python is not None, (f"no interpreter for {runtime}: run scripts/setup.sh --with-plugin-runtime "
                                "(CI installs it; these tests never skip)")
    config = GenaiConfig.load(model.parent)
    options = {k: v for k, v in config.provider_options("webgpu").items() if k != "enableGraphCapture"}
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps({
        "model": str(model), "genai_config": config.data, "webgpu_options": options, "embedding": embedding,
        "prefill": 8, "total": total, "ep": ep}))
    proc = subprocess.run([python, __file__, str(work / "job.json"), str(work)], env=child_env(runtime),
                          capture_output=True, text=True, timeout=600, check=False)
    if not (work / "result.json").is_file():
        return {"error": f"worker died ({proc.returncode}): {proc.stderr[-400:]}"}, None, None
    result = json.loads((work / "result.json").read_text())
    if result["error"]:
        return result, None, None
    return result, np.load(work / "prefill.npy"), np.load(work / "last.npy")


def main(job_path: str, out_dir: str) -> int:
    from rope_passes.check.decode import DecoderSpec, run_decode, token_ids
    from rope_passes.runtime.sessions import create_session, runtime_label

    job = json.loads(Path(job_path).read_text())
    out = Path(out_dir)
    result: dict = {"runtime": runtime_label(), "providers": None, "error": None}
    try:
        sess = create_session(job["model"], job.get("ep", "webgpu"), webgpu_options=job.get("webgpu_options") or {})
        result["providers"] = sess.get_providers()
        table = np.load(job["embedding"]) if job.get("embedding") else None
        spec = DecoderSpec.from_session(sess, job.get("genai_config"), embedding_table=table)
        prefill, total = int(job["prefill"]), int(job["total"])
        steps = run_decode(sess, spec, token_ids(total), prefill=prefill, steps=total - prefill)
        np.save(out / "prefill.npy", steps[0]["logits"][0].astype(np.float32))
        np.save(out / "last.npy", np.stack([s["logits"][0, -1].astype(np.float32) for s in steps]))
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"
        traceback.print_exc()
    (out / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
