"""A session in the page: :class:`WebSession`, with the ``run(names, feeds)`` of an onnxruntime session, so the
checker's run loop drives it unchanged; its inputs and outputs are read from the model file."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.runtime.web.browser import Browser


def external_data(model: str | Path) -> list[str]:
    """The external data files a model file names (relative to its folder), without reading any weights."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    found: list[str] = []

    def visit(tensors: Any) -> None:
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = next((e.value for e in t.external_data if e.key == "location"), None)
                if loc and loc not in found:
                    found.append(loc)

    def walk(graph: Any) -> None:
        visit(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    visit([attr.t])
                visit(attr.tensors)
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(proto.graph)
    return found


@dataclasses.dataclass
class WebSession:
    """One onnxruntime-web session in the page, with the ``run(names, feeds)`` of an onnxruntime session."""

    browser: Browser
    model: str | Path
    ep: str = "webgpu"  # "webgpu" | "wasm" (onnxruntime-web's CPU)
    webgpu_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    graph_capture: bool = False
    outputs_on_gpu: bool = False  # preferredOutputLocation 'gpu-buffer' (always under graph capture)
    timeout: float = 600

    def __post_init__(self) -> None:
        path = Path(self.model)
        data = [{"path": loc, "url": self.browser.serve(path.parent / loc)} for loc in external_data(path)]
        value = self.browser.call("create", {
            "url": self.browser.serve(path), "file": str(path.resolve()), "externalData": data, "ep": self.ep, "capture": self.graph_capture,
            "webgpuOptions": dict(self.webgpu_options), "outputsOnGpu": self.graph_capture or self.outputs_on_gpu}, timeout=self.timeout)
        self.id: int = value["id"]
        self.input_names: list[str] = value["inputs"]
        self.output_names: list[str] = value["outputs"]

    def get_providers(self) -> list[str]:
        return ["WebGpuExecutionProvider (onnxruntime-web)" if self.ep == "webgpu" else "wasm (onnxruntime-web)"]

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray],
            run_options: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        names = list(names or self.output_names)
        _, outs = self.browser.exchange("run", {"session": self.id, "names": names,
                                                "runOptions": dict(run_options or {})}, feeds, self.timeout)
        return [outs[n] for n in names]

    def release(self) -> None:
        self.browser.call("release", {"session": self.id})


__all__ = ["WebSession", "external_data"]
