"""Drive a decoder under WebGPU graph capture (``enableGraphCapture=1``) from raw Python, the way it has to be done.

What onnxruntime-webgpu 1.27 needs (measured; see docs/checker.md):

* every input and output bound through IOBinding to a **fixed WebGPU-resident OrtValue** that never changes between
  runs (a replay reads and writes the buffers it was captured with; new data goes in with ``ort.copy_tensors``).
  ``OrtValue.ortvalue_from_numpy(x, "webgpu", 0)`` fails in this wheel, so buffers are allocated as the output of a
  one-node ``Identity`` WebGPU session bound with ``bind_output(name, "webgpu", 0)``;
* a **static KV cache**: one ``[B, kv_heads, max_len, head]`` buffer per ``past_key_values.*``, bound as both the past
  input and the matching ``present.*`` output (GroupQueryAttention then shares past and present);
* the **attention mask at its maximum length** ``[B, max_len]``, ones for the tokens so far and zeros after, rewritten
  in place each step: the builder's ``_graph`` models compute ``seqlens_k = sum(mask) - 1`` and the total length
  ``max(sum(mask))`` from it, so advancing the mask advances both on the GPU;
* the prefill runs with ``RunOptions`` ``gpu_graph_id=-1`` (not captured: its shapes differ from a decode step's);
  the first single-token step is captured, the following ones replay it.

``present.*`` outputs are read back trimmed to the tokens so far, so they compare with an uncaptured run's.
The checked conversation is genai's **second** on these buffers: an earlier one, :data:`.client_schedules.
EARLIER_MORE` tokens longer (other ids, every call uncaptured), runs first and leaves its rows in the KV buffers;
the checked prefill starts at past length 0 over them, as a new generator of the same model does.
A session that cannot be created with capture (Memcpy nodes, control flow) raises with onnxruntime's reason.
Both sessions here (the decoder's and the one-node allocator's) come from
:func:`rope_passes.runtime.sessions.create_session`, on either WebGPU runtime; this module only binds buffers to them.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from rope_passes.check.client_schedules import EARLIER_MORE
from rope_passes.check.decode import PAST_PREFIX, DecoderSpec, InputSpec, keep_step, step_feeds, token_ids
from rope_passes.errors import UsageError
from rope_passes.runtime.sessions import create_session, session_options

_ONNX_TYPES = {np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float32): TensorProto.FLOAT,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}


class WebGPUBuffers:
    """Allocates fixed WebGPU-resident OrtValues (the only way this onnxruntime wheel offers) and refills them."""

    def __init__(self) -> None:
        self._sessions: dict[np.dtype, ort.InferenceSession] = {}

    def new(self, shape: tuple[int, ...], dtype: Any) -> ort.OrtValue:
        dtype = np.dtype(dtype)
        if dtype not in self._sessions:
            if dtype not in _ONNX_TYPES:
                raise UsageError(f"cannot allocate a WebGPU buffer of {dtype} for graph capture")
            t = _ONNX_TYPES[dtype]
            graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "alloc",
                                      [helper.make_tensor_value_info("x", t, None)],
                                      [helper.make_tensor_value_info("y", t, None)])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 10
            self._sessions[dtype] = create_session(model.SerializeToString(), "webgpu",
                                                   webgpu_options={"enableInt64": "1"})
        sess = self._sessions[dtype]
        io = sess.io_binding()
        io.bind_cpu_input("x", np.zeros(shape, dtype))
        io.bind_output("y", "webgpu", 0)
        sess.run_with_iobinding(io)
        value = io.get_outputs()[0]
        if value.device_name().lower() == "cpu":  # this wheel names any GPU device "cuda"
            raise RuntimeError("the WebGPU buffer was allocated on the CPU")
        return value

    @staticmethod
    def fill(buffer: ort.OrtValue, array: np.ndarray) -> None:
        ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))], [buffer], None)


class CaptureDriver:
    """Prefill (uncaptured) + ``spec.steps`` single-token steps, captured on the first and replayed after
    (``captured=False``: the same session options and calls on the same fixed buffers, every step run with
    ``gpu_graph_id=-1``, as the prefill is: eagerly, nothing captured nor replayed).

    A session without ``enableGraphCapture`` is no eager twin: onnxruntime-webgpu 1.27 then reads GroupQueryAttention's
    total length on the CPU, and on these bound GPU buffers it reads 0 (``total_sequence_length must be positive``,
    measured on the builder's ``_graph`` models)."""

    def __init__(self, spec: Any, embedding_table: np.ndarray | None = None, log_severity: int = 3,
                 captured: bool = True) -> None:
        self.spec, self.captured = spec, captured
        so = session_options("webgpu", graph_capture=True, webgpu_options=spec.webgpu_options,
                             log_severity=log_severity)
        self.session = create_session(spec.model, "webgpu", so=so)
        self.providers = list(self.session.get_providers())
        self.dspec = DecoderSpec.from_session(self.session, spec.genai_config, dims=dict(spec.dims),
                                              embedding_table=embedding_table)
        if not self.dspec.is_decoder:
            raise UsageError("graph capture checks need a decoder graph (input_ids/inputs_embeds + attention_mask)")
        self.max_len = (spec.max_length or (spec.prefill + spec.steps)) + EARLIER_MORE
        self.notes: list[str] = []
        self.buffers = WebGPUBuffers()

    def run(self, on_step: Any = None, results: list | None = None) -> list[dict[str, np.ndarray]]:
        spec, dspec, sess, buf = self.spec, self.dspec, self.session, self.buffers
        tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
        outputs = {o.name: o for o in sess.get_outputs()}
        # static KV: [B, kv_heads, max_len, head], bound as past and present
        empty = step_feeds(dspec, tokens[:, :spec.prefill], 0, None)
        kv = {}
        for name in dspec.past_names:
            b, h, _, d = empty[name].shape
            kv[name] = buf.new((b, h, self.max_len, d), empty[name].dtype)
        mask_spec = cast(InputSpec, dspec.input("attention_mask"))  # a decoder (checked in __init__) has one
        mask = buf.new((1, self.max_len), mask_spec.dtype)
        others = [i for i in dspec.inputs if i.name != "attention_mask" and not i.name.startswith(PAST_PREFIX)]
        plain_outputs = [n for n in dspec.outputs if not n.startswith("present.")]

        def phase(seq: int) -> tuple[ort.SessionIOBinding, dict[str, ort.OrtValue], dict[str, ort.OrtValue]]:
            feeds = step_feeds(dspec, tokens[:, :seq], 0, None)
            ins = {i.name: buf.new(feeds[i.name].shape, feeds[i.name].dtype) for i in others}
            outs = {n: buf.new(tuple(dspec.output_shape(n, outputs[n].shape, seq)), _np_type(outputs[n].type))
                    for n in plain_outputs}
            io = sess.io_binding()
            io.bind_ortvalue_input("attention_mask", mask)
            for n, v in ins.items():
                io.bind_ortvalue_input(n, v)
            for n, v in kv.items():
                io.bind_ortvalue_input(n, v)
                present = dspec.present_name(n)
                if present in outputs:
                    io.bind_ortvalue_output(present, v)
            for n, v in outs.items():
                io.bind_ortvalue_output(n, v)
            return io, ins, outs

        results = [] if results is None else results
        no_capture = ort.RunOptions()
        no_capture.add_run_config_entry("gpu_graph_id", "-1")
        io_pre, ins_pre, outs_pre = phase(spec.prefill)
        io_dec, ins_dec, outs_dec = phase(1) if spec.steps else (None, {}, {})

        def conversation(ids: np.ndarray, steps: int, keep: list | None) -> None:
            mask_host = np.zeros((1, self.max_len), mask_spec.dtype)  # a new generator: a new mask, the same KV
            past_len = 0
            for step in range(steps + 1):
                seq = spec.prefill if step == 0 else 1
                total = past_len + seq
                feeds = step_feeds(dspec, ids[:, past_len:total], past_len, {n: np.zeros(0) for n in kv})
                mask_host[:, :total] = 1
                buf.fill(mask, mask_host)
                ins, outs, io = (ins_pre, outs_pre, io_pre) if step == 0 else (ins_dec, outs_dec, io_dec)
                for n, v in ins.items():
                    buf.fill(v, feeds[n])
                if step == 0 or keep is None or not self.captured:
                    sess.run_with_iobinding(io, no_capture)
                else:
                    sess.run_with_iobinding(io)
                if keep is not None:
                    keep.append(self._read(outs, kv, outputs, total, past_len, step == steps))
                    if on_step is not None:
                        on_step(step)
                past_len = total

        if spec.steps:  # genai's earlier conversation on the same buffers: longer, other ids, uncaptured
            more = spec.steps + EARLIER_MORE
            conversation(token_ids(spec.prefill + more, spec.seed + 1, spec.vocab), more, None)
        conversation(tokens, spec.steps, results)
        if not self.captured:
            self.notes.append("every step run eagerly on the fixed buffers (gpu_graph_id=-1)")
        elif spec.steps:
            self.notes.append("prefill run uncaptured (gpu_graph_id=-1); decode step 1 captured"
                              + (f", steps 2..{spec.steps} replayed" if spec.steps > 1 else "")
                              + f"; after an earlier conversation of {spec.prefill + spec.steps + EARLIER_MORE} "
                              "tokens on the same KV buffers (uncaptured), whose rows past the checked ones stay")
        else:
            self.notes.append("no decode step (--steps 0): nothing was captured")
        return results

    def _read(self, outs: dict[str, ort.OrtValue], kv: dict[str, ort.OrtValue], outputs: dict[str, Any], total: int,
              past_len: int, last: bool) -> dict[str, np.ndarray]:
        """One call's outputs as a caller reads them: ``present.*`` trimmed to the tokens so far."""
        result = {n: v.numpy().copy() for n, v in outs.items()}
        for n, v in kv.items():
            present = self.dspec.present_name(n)
            if present in outputs:
                result[present] = v.numpy()[:, :, :total].copy()
        return keep_step({n: result[n] for n in self.dspec.outputs if n in result}, past_len, last)


def _np_type(ort_type: str) -> np.dtype:
    from rope_passes.check.decode import numpy_dtype

    dtype = numpy_dtype(ort_type)
    if dtype is None:
        raise KeyError(ort_type)
    return dtype
