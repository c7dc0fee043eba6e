"""One run of the checker in the browser (``check --runtime web``): a :class:`~.runner.RunSpec` on onnxruntime-web's
WebGPU EP in headless Chromium (:mod:`rope_passes.runtime.web`), with the same schedule and the same
:class:`~.runner.RunResult` as a run on a Python runtime.

* plain runs: :func:`.decode.run_decode` and :func:`.sweep.run_sweep` drive a :class:`~rope_passes.runtime.web.
  WebSession` (every call's feeds go to the page, its outputs come back), so the browser sees exactly the inputs the
  Python runtimes see;
* captured runs (``graph_capture``): :class:`WebCaptureDriver`, the browser's form of :class:`.capture.
  CaptureDriver`: ``enableGraphCapture`` on the session, every input and output bound to a fixed ``GPUBuffer`` on
  onnxruntime-web's device (``Tensor.fromGpuBuffer``), a static KV buffer bound as both past and present, the
  attention mask at its maximum length, the prefill uncaptured (on a second session of the model without capture,
  writing the same KV buffers: onnxruntime-web binds a capture session's buffers on its first run only), decode
  step 1 captured and the later ones replayed. The buffers are onnxruntime's own (outputs of a one-node
  ``Identity`` session): buffers the page creates itself make the native bundle's replays fail (docs/runtimes.md). Where a replay fails, the steps before it are kept and the run is
  ``run-failed`` at that step, with the browser's error.

The CPU runs of a check (``original@cpu``) are not run here: they stay on onnxruntime's CPU EP in Python, the
reference every runtime is compared with.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rope_passes.check.decode import (
    ORT_DTYPES,
    PAST_PREFIX,
    PRESENT_PREFIX,
    DecoderSpec,
    keep_step,
    random_feeds,
    run_decode,
    step_feeds,
    token_ids,
)
from rope_passes.check.runner import LOAD_FAILED, OK, RUN_FAILED, RunResult, RunSpec
from rope_passes.errors import UsageError

_SEQ_DIMS = {"sequence_length", "seq_len", "sequence", "sequence_len"}  # sequence_len: mobius-onnx


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:600]


def _output_shapes(model: str) -> dict[str, tuple[Any, ...]]:
    import onnx

    proto = onnx.load(model, load_external_data=False)
    return {o.name: tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in o.type.tensor_type.shape.dim) for o in proto.graph.output}


def _output_types(model: str) -> dict[str, np.dtype]:
    import onnx

    from rope_passes.check.decode import _ONNX_TO_ORT

    proto = onnx.load(model, load_external_data=False)
    return {o.name: ORT_DTYPES[_ONNX_TO_ORT[o.type.tensor_type.elem_type]] for o in proto.graph.output}


class WebCaptureDriver:
    """Prefill (uncaptured) + ``spec.steps`` single-token steps, captured on the first and replayed after, in the
    browser (see the module docstring)."""

    def __init__(self, browser: Any, spec: RunSpec, embedding_table: np.ndarray | None = None,
                 own_buffers: bool = False) -> None:
        from rope_passes.runtime.web import WebSession

        self.browser, self.spec = browser, spec
        self.session = WebSession(browser, spec.model, "webgpu", webgpu_options=spec.webgpu_options,
                                  graph_capture=True)
        # onnxruntime-web binds a capture session's inputs and outputs on its first run only (it never rebinds
        # them: 1.30's wasm-core-impl), so the prefill's buffers cannot be the decode's: the prefill runs on a
        # second session of the same model, without capture, writing the same static KV buffers
        self.prefill_session = WebSession(browser, spec.model, "webgpu", webgpu_options=spec.webgpu_options,
                                          outputs_on_gpu=True)
        self.dspec = DecoderSpec.from_model(spec.model, spec.genai_config, dims=dict(spec.dims),
                                            embedding_table=embedding_table)
        if not self.dspec.is_decoder:
            raise UsageError("graph capture checks need a decoder graph (input_ids/inputs_embeds + attention_mask)")
        self.max_len = spec.max_length or (spec.prefill + spec.steps)
        self.notes: list[str] = []
        #: True: GPUBuffers the page creates itself (the native bundle's replays then fail: docs/runtimes.md);
        #: False: onnxruntime's own buffers (outputs of a one-node Identity session), which replay
        self.own_buffers = own_buffers

    def _shape(self, name: str, declared: tuple[Any, ...], seq: int) -> list[int]:
        shape = []
        for d in declared:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif d in ("batch_size", "batch"):
                shape.append(1)
            elif d in _SEQ_DIMS:
                shape.append(seq)
            elif isinstance(d, str) and d in self.dspec.dims:
                shape.append(self.dspec.dims[d])
            else:
                raise UsageError(f"cannot size output {name} dimension {d!r} for graph capture: give --dim {d}=N")
        return shape

    def run(self, on_step: Callable[[int], None] | None = None,
            results: list[dict[str, np.ndarray]] | None = None) -> list[dict[str, np.ndarray]]:
        from rope_passes.runtime.web import _WEB_TYPES

        spec, dspec, b = self.spec, self.dspec, self.browser
        tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
        shapes, types = _output_shapes(spec.model), _output_types(spec.model)
        empty = step_feeds(dspec, tokens[:, :spec.prefill], 0, None)
        buffers: list[dict[str, Any]] = []

        def alloc(key: str, dims: list[int], dtype: np.dtype) -> str:
            buffers.append({"key": key, "dims": dims, "dtype": _WEB_TYPES[np.dtype(dtype)]})
            return key

        kv = {n: alloc(f"kv:{n}", [empty[n].shape[0], empty[n].shape[1], self.max_len, empty[n].shape[3]],
                       empty[n].dtype) for n in dspec.past_names}
        mask_dtype = empty["attention_mask"].dtype
        alloc("mask", [1, self.max_len], mask_dtype)
        others = [i for i in dspec.inputs if i.name != "attention_mask" and not i.name.startswith(PAST_PREFIX)]
        plain = [n for n in dspec.outputs if not n.startswith(PRESENT_PREFIX)]
        phases: dict[str, dict[str, Any]] = {}
        for name, seq in (("prefill", spec.prefill), ("decode", 1)):
            if name == "decode" and not spec.steps:
                continue
            feeds = step_feeds(dspec, tokens[:, :seq], 0, None)
            ins = {i.name: alloc(f"{name}:{i.name}", list(feeds[i.name].shape), feeds[i.name].dtype)
                   for i in others}
            outs = {n: alloc(f"{name}:out:{n}", self._shape(n, shapes[n], seq), types[n]) for n in plain}
            inputs = {"attention_mask": "mask", **ins, **kv}
            outputs = {**outs, **{dspec.present_name(n): k for n, k in kv.items()
                                  if dspec.present_name(n) in shapes}}
            phases[name] = {"ins": ins, "outs": outs, "inputs": inputs, "outputs": outputs}
        b.call("gpuAlloc", {"buffers": buffers, "allocators": None if self.own_buffers else b.allocators()})
        results = [] if results is None else results
        mask_host = np.zeros((1, self.max_len), mask_dtype)
        past_len = 0
        try:
            for step in range(spec.steps + 1):
                phase = phases["prefill" if step == 0 else "decode"]
                seq = spec.prefill if step == 0 else 1
                chunk = tokens[:, past_len:past_len + seq]
                total = past_len + seq
                feeds = step_feeds(dspec, chunk, past_len, {n: np.zeros(0) for n in kv})
                mask_host[:, :total] = 1
                writes = {"mask": mask_host, **{key: feeds[name] for name, key in phase["ins"].items()}}
                read = [*phase["outs"].values(), *kv.values()]
                session = self.prefill_session if step == 0 else self.session
                _, got = b.exchange("runBound", {"session": session.id, "inputs": phase["inputs"],
                                                 "outputs": phase["outputs"], "read": read}, writes)
                result = {n: got[k] for n, k in phase["outs"].items()}
                for n, k in kv.items():
                    if dspec.present_name(n) in shapes:
                        result[dspec.present_name(n)] = got[k][:, :, :total].copy()
                results.append(keep_step({n: result[n] for n in dspec.outputs if n in result}, past_len,
                                         step == spec.steps))
                past_len = total
                if on_step is not None:
                    on_step(step)
        finally:
            b.call("gpuFree", {})
            self.prefill_session.release()
        if spec.steps:
            self.notes.append("prefill run uncaptured (a second session of the model, on the same KV buffers); "
                              "decode step 1 captured"
                              + (f", steps 2..{spec.steps} replayed" if spec.steps > 1 else ""))
        else:
            self.notes.append("no decode step (--steps 0): nothing was captured")
        return results


def execute_web_run(spec: RunSpec, on_step: Callable[[int], None] | None = None,
                    on_sweep: Callable[[int], None] | None = None, bundle: str = "webgpu",
                    on_schedule: Callable[[int], None] | None = None) -> RunResult:
    """Run ``spec`` (``ep == "webgpu"``) in this process's browser; every failure becomes a status with a one-line
    reason, as :func:`.runner.execute_run` does for a Python runtime. A page that crashed is reopened."""
    from rope_passes.check.sweep import run_sweep
    from rope_passes.runtime.web import WebRuntimeUnavailable, WebSession, browser

    start = time.perf_counter()
    if spec.ep != "webgpu":
        raise UsageError(f"the browser runs WebGPU sessions only, not {spec.ep!r}")
    try:
        b = browser(bundle)
    except (WebRuntimeUnavailable, RuntimeError, OSError) as exc:
        return RunResult(spec.label, LOAD_FAILED, f"cannot start the browser runtime: {_one_line(exc)}",
                         wall_s=time.perf_counter() - start)
    result = RunResult(spec.label, OK, runtime=b.label, providers=["WebGpuExecutionProvider (onnxruntime-web)"])
    result.notes.append(f"browser WebGPU adapter: {b.adapter_summary}")
    mark = len(b.events)
    table = np.load(spec.embedding) if spec.embedding else None
    session: Any = None
    driver: WebCaptureDriver | None = None
    try:
        if spec.graph_capture:
            driver = WebCaptureDriver(b, spec, table)
            session = driver.session
        else:
            session = WebSession(b, spec.model, "webgpu", webgpu_options=spec.webgpu_options)
    except Exception as exc:  # noqa: BLE001 - a model that does not load is a result
        result.status, result.reason = LOAD_FAILED, _one_line(exc)
        _after(b, mark, result)
        result.wall_s = time.perf_counter() - start
        return result
    dspec = None
    try:
        if driver is not None:
            driver.run(on_step=on_step, results=result.steps)
            result.notes.extend(driver.notes)
        else:
            dspec = DecoderSpec.from_model(spec.model, spec.genai_config, dims=dict(spec.dims), embedding_table=table,
                                           vocab=spec.vocab)
            if dspec.is_decoder:
                tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
                run_decode(session, dspec, tokens, spec.prefill, spec.steps, on_step=on_step, results=result.steps)
            else:
                feeds = random_feeds(dspec, spec.seed)
                result.steps = [dict(zip(dspec.outputs, session.run(dspec.outputs, feeds)))]
                if on_step:
                    on_step(0)
    except Exception as exc:  # noqa: BLE001
        result.status, result.reason = RUN_FAILED, _one_line(exc)
        result.failed_step = len(result.steps)
    schedules = getattr(spec, "schedules", None) or []  # the checker's schedules (.schedules), where it has them
    if schedules and dspec is not None and dspec.is_decoder and driver is None and result.ok:
        from rope_passes.check.schedule_runs import run_schedule
        from rope_passes.check.schedules import from_spec

        for k, data in enumerate(schedules):
            calls = result.schedules.setdefault(data["name"], [])
            try:
                run_schedule(session, dspec, from_spec(data), calls)
            except Exception as exc:  # noqa: BLE001 - a call that raises is a result; the calls before it are kept
                result.schedule_errors[data["name"]] = _one_line(exc)
            if on_schedule is not None:
                on_schedule(k)
    if spec.sweep and dspec is not None and dspec.is_decoder and driver is None and result.ok:
        for k, position in enumerate(spec.sweep):
            run_sweep(session, dspec, [position], spec.seed, result.sweep, result.sweep_errors)
            for name, value in result.sweep.get(position, {}).items():
                if name.startswith(PRESENT_PREFIX) and value.ndim == 4 and value.shape[2] > 1:
                    result.sweep[position][name] = np.ascontiguousarray(value[:, :, -1:, :])
            if on_sweep is not None:
                on_sweep(k)
    with contextlib.suppress(Exception):  # a page that crashed has nothing left to release
        session.release()
    _after(b, mark, result)
    result.wall_s = time.perf_counter() - start
    return result


def _after(b: Any, mark: int, result: RunResult) -> None:
    """A page crash or uncaught page error during the run: say so, and give the next run a fresh page."""
    crash = b.crashed_since(mark)
    if crash is None:
        return
    result.notes.append(f"the page failed during this run ({' '.join(crash.split())[:300]}); reopened")
    try:
        b.reload()
    except Exception as exc:  # noqa: BLE001 - the next run starts a new browser
        result.notes.append(f"reopening the page failed: {_one_line(exc)}")


__all__ = ["WebCaptureDriver", "execute_web_run"]
