"""Which run (:class:`RunKey`: the one home of a run's label), what one run of the checker is (:class:`RunSpec`,
plain data, JSON-serialisable) and what it gave (:class:`RunResult`), with the status values of a run: below the run
loop (:mod:`.runner`) and its backends (:mod:`.backends`), which both read them."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rope_passes.runtimes import WEBGPU_PLUGIN

#: status values of a run
OK, LOAD_FAILED, RUN_FAILED, CRASHED, TIMED_OUT = "ok", "load-failed", "run-failed", "crashed", "timed-out"
#: the checker could not drive the graph (a dimension it cannot size, not a decoder): no run happened, nothing about
#: the graph was learnt (the verdict is "could not run", exit 2, never "not equivalent")
NOT_RUN = "could-not-run"
#: how the reason of a load-failed run starts when its interpreter could not even be started
NOT_STARTED = "cannot start"

#: the graphs a check runs
ORIGINAL, REWRITTEN = "original", "rewritten"
#: how a run on the second runtime (the original's fallback, :attr:`rope_passes.runtimes.Runtime.fallback`) is
#: suffixed in its label
_RUNTIME_SUFFIX = {WEBGPU_PLUGIN: "plugin"}


@dataclasses.dataclass(frozen=True)
class RunKey:
    """Which run: a graph on an EP, on the check's runtime (``runtime`` None) or on another one (the original's
    fallback), captured or not. ``str()`` is its label (``original@cpu``, ``rewritten@webgpu+capture``,
    ``original@webgpu:plugin``), the one spelling of a run in reports, JSON and the worker's files; :meth:`parse`
    reads it back."""

    graph: str  # ORIGINAL | REWRITTEN
    ep: str  # cpu | webgpu
    runtime: str | None = None  # None: the check's runtime; else the runtime it ran on instead
    capture: bool = False

    def __str__(self) -> str:
        suffix = f":{_RUNTIME_SUFFIX.get(self.runtime, self.runtime)}" if self.runtime else ""
        return f"{self.graph}@{self.ep}{'+capture' if self.capture else ''}{suffix}"

    @classmethod
    def parse(cls, label: str) -> RunKey:
        graph, _, rest = label.partition("@")
        rest, _, tag = rest.partition(":")
        runtime = next((r for r, t in _RUNTIME_SUFFIX.items() if t == tag), tag) if tag else None
        ep, _, capture = rest.partition("+")
        return cls(graph, ep, runtime or None, capture == "capture")

    @property
    def original(self) -> bool:
        return self.graph == ORIGINAL

    @property
    def elsewhere(self) -> bool:
        """Run on another runtime than the check's (the original's fallback)."""
        return self.runtime is not None


@dataclasses.dataclass
class RunSpec:
    """What to run: a model on an EP, with a decode schedule (prefill + single-token steps)."""

    label: str  # e.g. "original@cpu"
    model: str  # path of the .onnx file
    ep: str  # "cpu" | "webgpu"
    prefill: int
    steps: int
    genai_config: dict | None = None
    webgpu_options: dict[str, str] = dataclasses.field(default_factory=dict)
    graph_capture: bool = False  # drive the session with fixed WebGPU buffers (see capture.py)
    max_length: int | None = None  # static KV length under capture
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    embedding: str | None = None  # .npy embedding table for inputs_embeds graphs
    seed: int = 0
    sweep: list[int] = dataclasses.field(default_factory=list)  # positions of single steps after a random past
    schedules: list[dict] = dataclasses.field(default_factory=list)  # .schedules.Schedule.spec() of each, in order
    schedules_twice: int = 0  # a reference: .schedule_runs.run_reference (twice, rows alone); ids below this vocab
    vocab: int | None = None  # the decode's and the sweep's ids below this (.plan.vocabulary)
    parts: dict[str, Any] = dataclasses.field(default_factory=dict)  # kind NAME -> its data (.evidence)

    @property
    def key(self) -> RunKey:
        return RunKey.parse(self.label)


@dataclasses.dataclass
class RunResult:
    label: str
    status: str
    reason: str = ""
    steps: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    providers: list[str] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    failed_step: int | None = None  # run-failed: the step whose call raised (the steps before it are kept)
    runtime: str = ""  # "onnxruntime <version>" that ran it
    sweep: dict[int, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)  # position -> outputs
    sweep_errors: dict[int, str] = dataclasses.field(default_factory=dict)  # position -> why its call raised
    schedules: dict[str, list[dict[str, np.ndarray]]] = dataclasses.field(default_factory=dict)  # name -> calls
    schedule_errors: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why the next call raised
    parts: dict[str, list[dict[str, np.ndarray]]] = dataclasses.field(default_factory=dict)  # kind -> its outputs
    part_errors: dict[str, str] = dataclasses.field(default_factory=dict)  # kind -> why its run raised

    @property
    def key(self) -> RunKey:
        return RunKey.parse(self.label)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "status": self.status, "reason": self.reason, "providers": self.providers,
                "steps_run": len(self.steps), "failed_step": self.failed_step, "runtime": self.runtime,
                "wall_s": round(self.wall_s, 3), "notes": self.notes, "sweep_positions": sorted(self.sweep),
                "sweep_errors": {str(p): e for p, e in sorted(self.sweep_errors.items())},
                "schedules_run": {n: len(c) for n, c in self.schedules.items()},
                "schedule_errors": dict(self.schedule_errors),
                "parts_run": {n: len(c) for n, c in self.parts.items()}, "part_errors": dict(self.part_errors)}


def one_line(exc: BaseException) -> str:
    """An exception as a run's one-line reason."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:600]


__all__ = ["CRASHED", "LOAD_FAILED", "NOT_RUN", "NOT_STARTED", "OK", "ORIGINAL", "REWRITTEN", "RUN_FAILED", "TIMED_OUT",
           "RunKey", "RunResult", "RunSpec", "one_line"]
