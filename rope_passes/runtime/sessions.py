"""onnxruntime sessions that are what they claim to be.

Traps handled here (see docs/checker.md): WebGPU provider options passed as a provider dict are silently ignored, so
every option is a session config entry ``ep.webgpuexecutionprovider.<key>``; a WebGPU failure silently falls back to
CPU, so every WebGPU session asserts that WebGPU is its first provider.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import onnxruntime as ort

from rope_passes.errors import RopePassesError

WEBGPU = "WebGpuExecutionProvider"
CPU = "CPUExecutionProvider"
EP_NAMES = {"webgpu": WEBGPU, "cpu": CPU}


class WebGPUUnavailableError(RopePassesError):
    """No WebGPU adapter: the session fell back to CPU."""


def session_options(
    ep: str = "webgpu",
    *,
    graph_capture: bool = False,
    webgpu_options: Mapping[str, str] | None = None,
    log_severity: int = 3,
) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    if ep == "webgpu":
        entries = dict(webgpu_options or {})
        if graph_capture:
            entries["enableGraphCapture"] = "1"
        for key, value in entries.items():
            so.add_session_config_entry(f"ep.webgpuexecutionprovider.{key}", str(value))
    return so


def create_session(
    model: str | os.PathLike | bytes,
    ep: str = "webgpu",
    *,
    graph_capture: bool = False,
    webgpu_options: Mapping[str, str] | None = None,
    so: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An InferenceSession on ``ep`` ("webgpu" or "cpu") that really runs there (raises otherwise)."""
    if ep not in EP_NAMES:
        raise RopePassesError(f"unknown execution provider {ep!r} (choose webgpu or cpu)")
    if so is None:
        so = session_options(ep, graph_capture=graph_capture, webgpu_options=webgpu_options)
    if ep == "webgpu" and WEBGPU not in ort.get_available_providers():
        raise WebGPUUnavailableError(
            f"this onnxruntime ({ort.__version__}) has no {WEBGPU}; install onnxruntime-webgpu"
        )
    providers = [EP_NAMES[ep]] if ep == "cpu" else [WEBGPU, CPU]
    source = str(model) if isinstance(model, (str, Path, os.PathLike)) else model
    sess = ort.InferenceSession(source, sess_options=so, providers=providers)
    if ep == "webgpu" and sess.get_providers()[0] != WEBGPU:
        raise WebGPUUnavailableError(
            "WebGPU session fell back to CPU (no WebGPU adapter? run scripts/setup.sh to install a Vulkan driver)"
        )
    return sess
