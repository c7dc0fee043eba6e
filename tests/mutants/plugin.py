"""References for mutants that onnxruntime 1.27 cannot load: the mutant itself on onnxruntime >= 1.31
(``.venv-plugin``), whose kernels *define* what ``MRotaryEmbedding`` (its CPU EP) and GroupQueryAttention's fused
q/k-norm inputs 14/15 (its WebGPU plugin EP only) compute, attributes read as that runtime reads them.

:class:`PluginRunner` keeps one child process on the plugin runtime's interpreter (this file run as a script: one
session, requests over stdin/stdout, tensors through ``.npz`` files), and offers what ``oracle.compare`` needs of a
runner: ``.session`` (input/output metadata, read from the model, for the feeds) and ``.run(feeds)``. The runtime's
refusal to load the mutant or run a call is the reference's (no contract there, as ``oracle.compare`` treats it); a
worker that dies or an interpreter that cannot start fails the test (``pytest.fail``): a broken ``.venv-plugin`` must
never pass a mutant by running nothing.

:class:`VisionPositions` wraps a runner so that the ``[3, B, S]`` position input carries three *different* axes
(image/video positions), the same for reference and candidate: a lowering that mixes up the axes must show.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RUNTIME = "onnxruntime-ep-webgpu"

class _Arg:
    def __init__(self, name: str, type_: str, shape: list):
        self.name, self.type, self.shape = name, type_, shape


class _Meta:
    """What ``DecoderSpec.from_session`` reads of a session, from the model file (weights not read)."""

    def __init__(self, model: Path):
        import onnx_ir as ir

        graph = ir.load(model).graph
        inits = set(graph.initializers)

        def arg(v) -> _Arg:
            dims = [d if isinstance(d, int) else str(d.value if hasattr(d, "value") else d) for d in (v.shape or [])]
            return _Arg(v.name, f"tensor({v.dtype.name.lower()})", dims)  # onnxruntime's spelling: tensor(float16)

        self._inputs = [arg(v) for v in graph.inputs if v.name not in inits]
        self._outputs = [arg(v) for v in graph.outputs]

    def get_inputs(self) -> list[_Arg]:
        return self._inputs

    def get_outputs(self) -> list[_Arg]:
        return self._outputs


class PluginRunner:
    """``model`` on the plugin runtime's ``ep`` ("cpu", or "webgpu": the plugin EP, for what its CPU EP lacks, e.g.
    fused q/k-norm GroupQueryAttention), in a child process (one per runner)."""

    def __init__(self, model: Path, ep: str = "cpu"):
        from rope_passes.runtimes.installed import child_env, python_for

        python = python_for(RUNTIME)
        assert python is not None, "no .venv-plugin: scripts/setup.sh --with-plugin-runtime (CI installs it)"
        self.session = _Meta(model)
        self._dir = tempfile.TemporaryDirectory(prefix="mutant-plugin-")
        self._proc = subprocess.Popen([python, __file__, str(model), ep], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=child_env(RUNTIME), text=True)
        self._k = 0
        ready = self._proc.stdout.readline().strip()
        if ready != "ready" and not ready.startswith("load-error:"):
            _broken(f"the plugin runtime's worker did not start ({python}): {ready[:300]!r}")
        #: the runtime's own refusal to load the mutant: then it runs no call (and a call has no contract)
        self.error = None if ready == "ready" else f"the plugin runtime cannot load the mutant: {ready[11:311]}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.error is not None:
            raise RuntimeError(self.error)
        self._k += 1
        src, dst = Path(self._dir.name) / f"in{self._k}.npz", Path(self._dir.name) / f"out{self._k}.npz"
        mine = {a.name for a in self.session.get_inputs()}
        np.savez(src, **{k: v for k, v in feeds.items() if k in mine})
        self._proc.stdin.write(json.dumps([str(src), str(dst)]) + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if not answer:
            _broken(f"the plugin runtime's worker died (exit {self._proc.poll()})")
        if answer != "ok":
            raise RuntimeError(answer)
        with np.load(dst) as data:
            return {k: data[k] for k in data.files}

    def close(self) -> None:
        if self._proc.poll() is None and self._proc.stdin is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        self._dir.cleanup()

    def __del__(self):
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


def _broken(message: str) -> None:
    import pytest

    pytest.fail(message)  # an OutcomeException: oracle.compare's `except Exception` does not take it for a skip


class VisionPositions:
    """``inner`` fed ``position_ids`` ``[3, B, S]`` with distinct axes: t = p, h = p // 2 + b, w = (3p + b) % 29
    (every value below 64, inside every corpus cache)."""

    def __init__(self, inner, unpadded: int = 0):
        self.inner = inner
        self.session = inner.session
        self.unpadded = unpadded  # the first rows keep their mask of ones (a batch padded to its longest row)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pos = feeds.get("position_ids")
        if pos is not None and pos.ndim == 3:
            p = pos[0]
            b = np.arange(p.shape[0], dtype=p.dtype)[:, None]
            feeds = {**feeds, "position_ids": np.ascontiguousarray(np.stack([p, p // 2 + b, (3 * p + b) % 29]))}
        return self.inner.run(feeds)


def _serve(model: str, ep: str) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    try:
        if ep == "webgpu":
            from rope_passes.runtime.sessions import create_session

            sess = create_session(model, "webgpu")
        else:
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the answer is the error
        print("load-error: " + " ".join(str(exc).split())[:400], flush=True)
        return
    print("ready", flush=True)
    names = [o.name for o in sess.get_outputs()]
    for line in sys.stdin:
        src, dst = json.loads(line)
        try:
            with np.load(src) as data:
                feeds = {k: data[k] for k in data.files}
            np.savez(dst, **dict(zip(names, sess.run(names, feeds))))
            print("ok", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])


class LeftPaddedMask:
    """``inner`` fed an ``attention_mask`` whose rows all start with a zero in calls after a past (left padding: no
    row is all ones, so the mask's width is not its largest row sum), the same for reference and candidate: lengths
    computed from the mask must be the original's for every mask; ``position_ids`` (when the graph takes them) number
    each row's real tokens from 0, as Hugging Face and onnxruntime-genai do for a padded row. Not in a prefill: onnxruntime 1.27's CPU
    GroupQueryAttention is not deterministic there for a padded row (two runs of the same graph on the same feeds
    differ by up to 1.8 in the logits: it reads memory the padding leaves unwritten)."""

    def __init__(self, inner, unpadded: int = 0):
        self.inner = inner
        self.session = inner.session
        self.unpadded = unpadded  # the first rows keep their mask of ones (a batch padded to its longest row)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mask = feeds.get("attention_mask")
        ids = feeds.get("input_ids")
        embeds = feeds.get("inputs_embeds")
        length = ids.shape[1] if ids is not None else (embeds.shape[1] if embeds is not None else None)
        if mask is not None and length is not None and mask.shape[1] > length:
            mask = mask.copy()
            mask[self.unpadded:, 0] = 0
            feeds = {**feeds, "attention_mask": mask}
            pos = feeds.get("position_ids")
            if pos is not None:  # as Hugging Face / genai number a padded row: its real tokens from 0
                real = (np.cumsum(mask, axis=1) - 1)[:, -length:].astype(pos.dtype)
                feeds["position_ids"] = np.ascontiguousarray(np.broadcast_to(real, pos.shape))
        return self.inner.run(feeds)
