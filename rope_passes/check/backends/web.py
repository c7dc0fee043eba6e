"""The browser's backend (``check --runtime web``): a :class:`~rope_passes.check.runner.RunSpec` on onnxruntime-web's
WebGPU EP in headless Chromium (:mod:`rope_passes.runtime.web`), driven by the one run loop
(:func:`rope_passes.check.runner.execute_run`) with the same schedule and the same result as a Python runtime's.

* plain runs: the loop drives a :class:`~rope_passes.runtime.web.WebSession` (every call's feeds go to the page, its
  outputs come back), so the browser sees exactly the inputs the Python runtimes see;
* captured runs (``graph_capture``): :class:`WebCaptureDriver`, the browser's form of
  :class:`rope_passes.check.capture.CaptureDriver`, is the decode loop users copy (``examples/web_decode_loop.mjs``,
  which the page imports): ``enableGraphCapture`` on the decode session, every input and output bound to a fixed
  GPU buffer on onnxruntime-web's device, a static KV buffer bound as both past and present, the attention mask at
  its maximum length, the prefill uncaptured (on a second session of the model without capture, writing the same
  KV buffers: onnxruntime-web binds a capture session's buffers on its first run only), decode step 1 captured and
  the later ones replayed. The buffers are onnxruntime's own (outputs of a one-node ``Identity`` session): buffers
  the page creates itself make the native bundle's replays fail (docs/runtimes.md). Where a replay fails, the steps
  before it are kept and the run is ``run-failed`` at that step, with the browser's error.

Where it runs (:func:`host_for`): in headless Chromium, unless the graph computes in float16 and Chromium's adapter
lacks ``shader-f16`` (SwiftShader, on a machine without a GPU): then onnxruntime-web's same bundle runs in Node on
the ``webgpu`` npm package (Dawn for Node), whose adapter (Mesa lavapipe here) has it. That is the browser's wasm
and kernels, not the browser: the run's runtime label and notes say so. ``$ROPE_PASSES_WEB_HOST`` (``chromium`` or
``dawn``) chooses the host for every graph.

The CPU runs of a check (``original@cpu``) are not run here (:func:`backend` is None for them): they stay on
onnxruntime's CPU EP in Python, the reference every runtime is compared with. Its choices in the loop
(:class:`WebBackend`): a failed run stops there (a page that failed a call would make every later call wait for
its timeout), and a reference run makes each schedule once (each padded row alone and twice cost the browser
minutes; the reference runs of a check are onnxruntime's CPU EP's, which make them).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.check.backends import RunBackend
from rope_passes.check.decode import (
    PRESENT_PREFIX,
    DecoderSpec,
    keep_step,
    step_feeds,
    token_ids,
)
from rope_passes.check.spec import RunResult, RunSpec, one_line
from rope_passes.errors import UsageError

WHAT = "the browser runtime"
#: the host every browser run uses, whatever its graph (``chromium`` or ``dawn``; unset: :func:`host_for` chooses)
HOST_ENV = "ROPE_PASSES_WEB_HOST"


def missing() -> str | None:
    """Why the browser runtime cannot start here (None: it can), with the command that sets it up."""
    from rope_passes.runtime.web import missing as web_missing

    return web_missing()


def backend(spec: RunSpec, bundle: str = "webgpu") -> WebBackend | None:
    """The browser runs the WebGPU runs of a check; None for the others (onnxruntime's CPU EP here)."""
    return WebBackend(bundle, spec) if spec.ep == "webgpu" else None


@functools.cache
def computes_in_fp16(model: str) -> bool:
    """Whether a graph has float16 inputs, outputs or initializers (its WebGPU kernels then need ``shader-f16``);
    no weights are read."""
    import onnx

    proto = onnx.load(model, load_external_data=False)
    graph = proto.graph
    return (any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in (*graph.input, *graph.output))
            or any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer))


def host_for(spec: RunSpec, chromium: Any) -> str | None:
    """The host that runs ``spec`` when Chromium (``chromium``: its started browser) should not: ``dawn`` for a
    float16 graph on an adapter without ``shader-f16``; None: Chromium runs it."""
    from rope_passes.runtime.web.install import DAWN

    return DAWN if computes_in_fp16(spec.model) and not chromium.has_f16 else None


def _output_shapes(model: str) -> dict[str, tuple[Any, ...]]:
    import onnx

    proto = onnx.load(model, load_external_data=False)
    return {o.name: tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in o.type.tensor_type.shape.dim) for o in proto.graph.output}



class WebCaptureDriver:
    """Prefill (uncaptured) + ``spec.steps`` single-token steps, captured on the first and replayed after, in the
    browser, by the decode loop users copy (``examples/web_decode_loop.mjs``, imported by the page: its
    ``createDecoder``, ``prefill`` and ``step``); see the module docstring."""

    def __init__(self, browser: Any, spec: RunSpec, embedding_table: np.ndarray | None = None) -> None:
        from rope_passes.runtime.web.session import external_data

        self.browser, self.spec = browser, spec
        self.dspec = DecoderSpec.from_model(spec.model, spec.genai_config, dims=dict(spec.dims),
                                            embedding_table=embedding_table)
        if not self.dspec.is_decoder:
            raise UsageError("graph capture checks need a decoder graph (input_ids/inputs_embeds + attention_mask)")
        self.max_len = spec.max_length or (spec.prefill + spec.steps)
        dspec, shapes = self.dspec, _output_shapes(spec.model)
        empty = step_feeds(dspec, token_ids(1, spec.seed, spec.vocab), 0, None)
        self.kv = {n: dspec.present_name(n) for n in dspec.past_names if dspec.present_name(n) in shapes}
        self.plain = [n for n in dspec.outputs if not n.startswith(PRESENT_PREFIX)]
        path = Path(spec.model)
        data = [{"path": loc, "url": browser.serve(path.parent / loc)} for loc in external_data(path)]
        value = browser.call("loopCreate", {
            "url": browser.serve(path), "file": str(path.resolve()), "externalData": data, "capture": True,
            "webgpuOptions": dict(spec.webgpu_options), "maxLength": self.max_len, "kv": self.kv,
            "kvDims": {n: [empty[n].shape[0], empty[n].shape[1], self.max_len, empty[n].shape[3]] for n in self.kv},
            "decodeOutputDims": {n: dspec.output_shape(n, shapes[n], 1) for n in self.plain}})
        self.loop_id: int = value["id"]
        self.providers = ["WebGpuExecutionProvider (onnxruntime-web)"]
        self.notes: list[str] = []

    def run(self, on_step: Callable[[int], None] | None = None,
            results: list[dict[str, np.ndarray]] | None = None) -> list[dict[str, np.ndarray]]:
        spec, dspec, b = self.spec, self.dspec, self.browser
        tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
        results = [] if results is None else results
        past_len = 0
        for step in range(spec.steps + 1):
            seq = spec.prefill if step == 0 else 1
            feeds = step_feeds(dspec, tokens[:, past_len:past_len + seq], past_len, {n: np.zeros(0) for n in self.kv})
            feeds = {n: v for n, v in feeds.items() if n != "attention_mask" and n not in self.kv}
            total = past_len + seq
            _, got = b.exchange("loopRun", {"decoder": self.loop_id}, feeds)
            result = {n: got[n] for n in self.plain}
            result.update({present: got[past][:, :, :total].copy() for past, present in self.kv.items()})
            results.append(keep_step({n: result[n] for n in dspec.outputs if n in result}, past_len,
                                     step == spec.steps))
            past_len = total
            if on_step is not None:
                on_step(step)
        if spec.steps:
            self.notes.append("examples/web_decode_loop.mjs: prefill run uncaptured (a second session of the model, "
                              "on the same KV buffers); decode step 1 captured"
                              + (f", steps 2..{spec.steps} replayed" if spec.steps > 1 else ""))
        else:
            self.notes.append("no decode step (--steps 0): nothing was captured")
        return results

    def release(self) -> None:
        self.browser.call("loopRelease", {"decoder": self.loop_id})


class WebBackend(RunBackend):
    """One run in this process's browser (``bundle``: onnxruntime-web's, :data:`rope_passes.runtime.web.BUNDLES`);
    a page that crashed during the run is said in its notes and reopened."""

    what = WHAT
    reference_runs = False  # each schedule once (the module docstring)
    after_failure = False  # a failed call ends the run (the module docstring)

    def __init__(self, bundle: str = "webgpu", spec: RunSpec | None = None, host: str | None = None) -> None:
        self.bundle, self.spec = bundle, spec
        self.host = host or os.environ.get(HOST_ENV) or None
        self.browser: Any = None
        self.mark = 0
        self._notes: list[str] = []

    def start(self) -> str:
        from rope_passes.runtime.web import browser
        from rope_passes.runtime.web.install import CHROMIUM, DAWN, HOSTS

        if self.host is not None and self.host not in HOSTS:
            raise UsageError(f"${HOST_ENV}={self.host!r}: choose chromium or dawn")
        host = self.host
        if host is None:
            chromium = browser(self.bundle)
            host = host_for(self.spec, chromium) if self.spec is not None else None
            if host is not None:
                self._notes.append(f"Chromium's WebGPU adapter ({chromium.adapter_summary}) cannot run this float16 "
                                   f"graph: {_CODE_PATH}")
            else:
                host = CHROMIUM
        self.browser = browser(self.bundle, host)
        self.mark = len(self.browser.events)
        if host == DAWN and not self._notes:
            self._notes.append(_CODE_PATH)
        return str(self.browser.label)

    def notes(self) -> list[str]:
        where = "browser" if self.browser.host == "chromium" else self.browser.host
        return [*self._notes, f"{where} WebGPU adapter: {self.browser.adapter_summary}"]

    def open(self, spec: RunSpec) -> Any:
        from rope_passes.runtime.web import WebSession

        if spec.ep != "webgpu":
            raise UsageError(f"the browser runs WebGPU sessions only, not {spec.ep!r}")
        return WebSession(self.browser, spec.model, "webgpu", webgpu_options=spec.webgpu_options)

    def decoder_spec(self, session: Any, spec: RunSpec, table: np.ndarray | None) -> DecoderSpec:
        return DecoderSpec.from_model(spec.model, spec.genai_config, dims=dict(spec.dims), embedding_table=table,
                                        vocab=spec.vocab)

    def capture(self, spec: RunSpec, table: np.ndarray | None, captured: bool = True) -> WebCaptureDriver:
        if not captured:  # the capture A/B's eager twin (evidence.capture_ab): reported as not run there
            raise UsageError("the browser's decode loop (examples/web_decode_loop.mjs) has no uncaptured mode on "
                             "the same buffers: the capture A/B runs on the Python runtimes")
        return WebCaptureDriver(self.browser, spec, table)

    def close(self, handle: Any, result: RunResult) -> None:
        if handle is not None:  # a WebSession or a WebCaptureDriver
            with contextlib.suppress(Exception):  # a page that crashed has nothing left to release
                handle.release()
        if self.browser is not None:
            _after(self.browser, self.mark, result)


#: what a run on the Dawn host is (in its notes)
_CODE_PATH = ("onnxruntime-web's wasm on Dawn for Node (the webgpu npm package): the browser's kernels, not the "
              "browser")


def _after(b: Any, mark: int, result: RunResult) -> None:
    """A page crash or uncaught page error during the run: say so, and give the next run a fresh page."""
    crash = b.crashed_since(mark)
    if crash is None:
        return
    result.notes.append(f"the page failed during this run ({' '.join(crash.split())[:300]}); reopened")
    try:
        b.reload()
    except Exception as exc:  # noqa: BLE001 - the next run starts a new browser
        result.notes.append(f"reopening the page failed: {one_line(exc)}")


__all__ = ["HOST_ENV", "WHAT", "WebBackend", "WebCaptureDriver", "backend", "computes_in_fp16", "host_for", "missing"]
