"""The backend of the Python runtimes (onnxruntime-webgpu, onnxruntime + the WebGPU plugin EP): sessions from
:func:`rope_passes.runtime.sessions.create_session`, graph capture by :class:`rope_passes.check.capture.CaptureDriver`.

Its runs are not driven from the checker's process by :func:`backend`: they run in a subprocess of the runtime's
interpreter (:func:`rope_passes.check.runner.run_isolated`, whose worker runs :func:`~rope_passes.check.runner.
execute_run` with :class:`NativeBackend`), or here with ``--in-process``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rope_passes.check.backends import RunBackend

if TYPE_CHECKING:
    import numpy as np

    from rope_passes.check.decode import DecoderSpec
    from rope_passes.check.spec import RunSpec

WHAT = "onnxruntime"


def missing() -> str | None:
    """A Python runtime is there when its interpreter is (:func:`rope_passes.check.core.interpreter`)."""
    return None


def backend(spec: RunSpec) -> RunBackend | None:
    """None: every run of a Python runtime goes the usual way (its interpreter, isolated unless asked otherwise)."""
    return None


class NativeBackend(RunBackend):
    """onnxruntime in this process (``capture_log``: log the capture session at info level, so the parent of a
    worker can count its replays)."""

    what = WHAT

    def __init__(self, capture_log: bool = False) -> None:
        self.capture_log = capture_log

    def start(self) -> str:
        from rope_passes.runtime.sessions import runtime_label

        return runtime_label()

    def open(self, spec: RunSpec) -> Any:
        from rope_passes.runtime.sessions import create_session

        return create_session(spec.model, spec.ep, webgpu_options=spec.webgpu_options)

    def decoder_spec(self, session: Any, spec: RunSpec, table: np.ndarray | None) -> DecoderSpec:
        from rope_passes.check.decode import DecoderSpec

        return DecoderSpec.from_session(session, spec.genai_config, dims=dict(spec.dims), embedding_table=table,
                                        vocab=spec.vocab)

    def capture(self, spec: RunSpec, table: np.ndarray | None, captured: bool = True) -> Any:
        from rope_passes.check.capture import CaptureDriver

        return CaptureDriver(spec, table, log_severity=1 if self.capture_log and captured else 3, captured=captured)


__all__ = ["WHAT", "NativeBackend", "backend", "missing"]
