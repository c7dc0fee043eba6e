"""Whether onnxruntime gets a WebGPU adapter at all (:func:`probe`), and which one: a real GPU, or a CPU (software)
Vulkan driver such as Mesa lavapipe (:func:`adapter_info`).

``python -m rope_passes.runtime.adapter`` exits 0 when a one-node graph runs on WebGpuExecutionProvider without a
silent CPU fallback, else 1 (scripts/setup.sh uses it to decide whether to install lavapipe);
``python -m rope_passes.runtime.adapter --vulkan-devices`` prints the Vulkan physical devices as JSON.

onnxruntime 1.27 does not expose Dawn's adapter info to Python, so the checker asks Vulkan directly (the backend Dawn
uses on Linux): a small ``ctypes`` probe of ``libvulkan`` lists the physical devices and their
``VkPhysicalDeviceType``. When every device is ``VK_PHYSICAL_DEVICE_TYPE_CPU`` (lavapipe reports "llvmpipe (LLVM
...)"), Dawn can only get a software adapter. No Vulkan loader, or no device, means "unknown": treated as a hardware
adapter, since nothing here may depend on lavapipe being present. ``ROPE_PASSES_SOFTWARE_ADAPTER=1`` (or ``0``)
overrides the probe.

Why it matters: on lavapipe, WebGPU GroupQueryAttention prefill is wrong for query rows >= 8 in one call (the
threshold follows ``LP_NATIVE_VECTOR_WIDTH``: 128 -> 4, 256 (default) -> 8, 512 -> 16), so the checker keeps WebGPU
prefills at :func:`max_webgpu_prefill` tokens there and reaches longer contexts by single-token decode steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys

_VK_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}


@dataclasses.dataclass(frozen=True)
class AdapterInfo:
    devices: tuple[tuple[str, str], ...]  # (name, type) per Vulkan physical device
    software: bool
    source: str  # "vulkan", "env", or "unknown: <why>"

    @property
    def summary(self) -> str:
        names = ", ".join(f"{n} ({t})" for n, t in self.devices) or "no Vulkan device found"
        return f"{'software' if self.software else 'hardware'} adapter: {names} [{self.source}]"


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def vulkan_devices() -> list[tuple[str, str]]:
    """(device name, device type) of every Vulkan physical device; raises OSError when there is no loader."""
    lib = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    vk = ctypes.CDLL(lib)
    app = _AppInfo(0, None, b"rope-passes", 1, b"rope-passes", 1, (1 << 22))  # sType 0 = APPLICATION_INFO
    info = _InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)  # sType 1 = INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        raise OSError("vkCreateInstance failed")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        out = []
        for h in handles[: count.value]:
            props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties is ~830 bytes
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(h), props)
            raw = props.raw
            dev_type = int.from_bytes(raw[16:20], "little")
            name = raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
            out.append((name, _VK_TYPES.get(dev_type, str(dev_type))))
        return out
    finally:
        vk.vkDestroyInstance(instance, None)


@functools.lru_cache(maxsize=1)
def adapter_info() -> AdapterInfo:
    """Probe once per process (in a subprocess, so a broken Vulkan driver cannot take the checker down)."""
    env = os.environ.get("ROPE_PASSES_SOFTWARE_ADAPTER")
    if env in ("0", "1"):
        return AdapterInfo((), env == "1", "env ROPE_PASSES_SOFTWARE_ADAPTER")
    try:
        proc = subprocess.run([sys.executable, "-m", "rope_passes.runtime.adapter", "--vulkan-devices"],
                              capture_output=True, text=True, timeout=60)
        devices = [tuple(d) for d in json.loads(proc.stdout.strip().splitlines()[-1])]
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        return AdapterInfo((), False, f"unknown: Vulkan probe failed ({type(exc).__name__})")
    if not devices:
        return AdapterInfo((), False, "unknown: no Vulkan device")
    return AdapterInfo(tuple(devices), all(t == "cpu" for _, t in devices), "vulkan")


def max_webgpu_prefill(info: AdapterInfo | None = None) -> int | None:
    """The largest WebGPU prefill that computes correctly here: None (no limit) on hardware adapters."""
    info = info or adapter_info()
    if not info.software:
        return None
    # llvmpipe names its vector width ("llvmpipe (LLVM 15.0.6, 256 bits)"); LP_NATIVE_VECTOR_WIDTH overrides it
    widths = [int(m.group(1)) for name, _ in info.devices if (m := re.search(r"(\d+) bits", name))]
    width = int(os.environ.get("LP_NATIVE_VECTOR_WIDTH") or (min(widths) if widths else 256))
    return max(1, min(8, width // 32))


def tiny_add_model() -> bytes:
    """A one-node ``y = x + x`` float model (IR 10, opset 17)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def probe() -> str | None:
    """None when a WebGPU session really runs (no silent CPU fallback) and computes right, else the reason."""
    import numpy as np

    from rope_passes.runtime.sessions import create_session

    try:
        sess = create_session(tiny_add_model(), "webgpu")
        y = sess.run(None, {"x": np.arange(4, dtype=np.float32)})[0]
    except Exception as exc:  # noqa: BLE001 - any failure means no adapter
        return " ".join(str(exc).split())
    if not np.array_equal(y, 2 * np.arange(4, dtype=np.float32)):
        return f"WebGPU computed a wrong result: {y}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--vulkan-devices"]:
        try:
            print(json.dumps(vulkan_devices()))
        except OSError:
            print("[]")
        return 0
    if args:
        print("usage: python -m rope_passes.runtime.adapter [--vulkan-devices]", file=sys.stderr)
        return 2
    reason = probe()
    print("webgpu: ok" if reason is None else f"webgpu: unavailable: {reason}")
    return 0 if reason is None else 1


if __name__ == "__main__":
    sys.exit(main())
