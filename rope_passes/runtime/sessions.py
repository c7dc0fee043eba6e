"""onnxruntime sessions that are what they claim to be, on either WebGPU runtime (:mod:`rope_passes.runtimes`).

Traps handled here (see docs/checker.md, docs/runtimes.md): WebGPU provider options passed as a provider dict are
silently ignored, so every option is a session config entry ``ep.webgpuexecutionprovider.<key>``; a WebGPU failure
silently falls back to CPU, so every WebGPU session asserts that WebGPU is its first provider.

The two runtimes open a WebGPU session differently:

* onnxruntime-webgpu 1.27 has the EP built in: ``providers=["WebGpuExecutionProvider", "CPUExecutionProvider"]``;
* onnxruntime ≥ 1.31 + ``onnxruntime-ep-webgpu`` (importable as ``onnxruntime_ep_webgpu``): the plugin library is
  registered once per process, its ``OrtEpDevice`` picked and given to ``SessionOptions.add_provider_for_devices``;
  ``providers=`` must not be passed then (onnxruntime ignores the devices and, by name, silently runs on CPU). The
  options travel as the same session config entries, which the plugin reads. Without a GPU the plugin lists no
  device unless ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` is set (then it runs on a software Vulkan driver).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rope_passes.interrupts import held_interrupts

with held_interrupts():  # not safe to interrupt (rope_passes.interrupts)
    import onnxruntime as ort

from rope_passes.errors import RopePassesError

WEBGPU = "WebGpuExecutionProvider"
CPU = "CPUExecutionProvider"
EP_NAMES = {"webgpu": WEBGPU, "cpu": CPU}
#: the plugin's switch for machines without a GPU (a software Vulkan adapter becomes a selectable device)
ALLOW_SOFTWARE_ADAPTER = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"


class WebGPUUnavailableError(RopePassesError):
    """No WebGPU adapter: the session fell back to CPU."""


def uses_plugin() -> bool:
    """Whether WebGPU comes from the plugin EP here (``onnxruntime_ep_webgpu`` importable), not built in."""
    return importlib.util.find_spec("onnxruntime_ep_webgpu") is not None


_PLUGIN_DEVICE: list[Any] = []


def plugin_device() -> Any:
    """Register the WebGPU plugin library (once per process, unless it already is) and return its WebGPU
    ``OrtEpDevice``; a hardware device is preferred over a software one. Raises WebGPUUnavailableError when it lists
    none."""
    if not _PLUGIN_DEVICE:
        devices = [d for d in ort.get_ep_devices() if d.ep_name == WEBGPU]
        if not devices:  # not registered yet in this process (by us or by anyone else: a second one fails)
            import onnxruntime_ep_webgpu

            ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
            devices = [d for d in ort.get_ep_devices() if d.ep_name == WEBGPU]
        if not devices:
            hint = "" if os.environ.get(ALLOW_SOFTWARE_ADAPTER) == "1" else (
                f"; without a GPU set {ALLOW_SOFTWARE_ADAPTER}=1 to allow a software Vulkan adapter")
            raise WebGPUUnavailableError(f"the onnxruntime-ep-webgpu plugin lists no WebGPU device (no Vulkan "
                                         f"driver? run scripts/setup.sh){hint}")
        devices.sort(key=lambda d: str(d.device.type).endswith("CPU"))  # a GPU first, the software adapter last
        _PLUGIN_DEVICE.append(devices[0])
    return _PLUGIN_DEVICE[0]


def runtime_label() -> str:
    """The onnxruntime this process runs: ``onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0`` (the plugin EP) or
    ``onnxruntime 1.27.0`` (onnxruntime-webgpu, WebGPU built in)."""
    if not uses_plugin():
        return f"onnxruntime {ort.__version__}"
    from importlib.metadata import PackageNotFoundError, version

    try:
        plugin = f" {version('onnxruntime-ep-webgpu')}"
    except PackageNotFoundError:  # importable without metadata (a source checkout): no version to say
        plugin = ""
    return f"onnxruntime {ort.__version__} + onnxruntime-ep-webgpu{plugin}"


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


def open_session(model: str | os.PathLike | bytes, so: ort.SessionOptions, ep: str = "webgpu") -> ort.InferenceSession:
    """An InferenceSession on ``ep`` with ``so``, on whichever WebGPU runtime is installed, WITHOUT the fallback
    check (placement probes record a fallback instead of raising); :func:`create_session` is the checked form."""
    source = str(model) if isinstance(model, (str, Path, os.PathLike)) else model
    if ep == "webgpu" and uses_plugin():
        so.add_provider_for_devices([plugin_device()], {})  # the options are config entries already
        return ort.InferenceSession(source, sess_options=so)
    providers = [EP_NAMES[ep]] if ep == "cpu" else [WEBGPU, CPU]
    return ort.InferenceSession(source, sess_options=so, providers=providers)


def create_session(
    model: str | os.PathLike | bytes,
    ep: str = "webgpu",
    *,
    graph_capture: bool = False,
    webgpu_options: Mapping[str, str] | None = None,
    so: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An InferenceSession on ``ep`` ("webgpu" or "cpu") that really runs there (raises otherwise), on onnxruntime's
    built-in WebGPU EP or the plugin EP, whichever is installed (see the module docstring)."""
    if ep not in EP_NAMES:
        raise RopePassesError(f"unknown execution provider {ep!r} (choose webgpu or cpu)")
    if so is None:
        so = session_options(ep, graph_capture=graph_capture, webgpu_options=webgpu_options)
    if ep == "webgpu" and not uses_plugin() and WEBGPU not in ort.get_available_providers():
        raise WebGPUUnavailableError(
            f"this onnxruntime ({ort.__version__}) has no {WEBGPU}; install onnxruntime-webgpu, or onnxruntime "
            "with the onnxruntime-ep-webgpu plugin"
        )
    sess = open_session(model, so, ep)
    if ep == "webgpu" and sess.get_providers()[0] != WEBGPU:
        raise WebGPUUnavailableError(
            "WebGPU session fell back to CPU (no WebGPU adapter? run scripts/setup.sh to install a Vulkan driver)"
        )
    return sess
