"""What a placement prediction (or probe) says: the Memcpy nodes onnxruntime inserts and the :class:`Placement` of one
model for one WebGPU configuration, with its capture verdict in words."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, order=True)
class Memcpy:
    """One Memcpy node onnxruntime inserts: ``MemcpyFromHost`` after ``tensor`` or ``MemcpyToHost`` before it."""

    kind: str  # "MemcpyFromHost" | "MemcpyToHost"
    tensor: str
    producer: str = dataclasses.field(default="", compare=False)  # node (or "graph input") that makes the tensor
    consumers: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # nodes that read the copy
    #: names of tensors onnxruntime merges with this one (common subexpressions); it may name any of them
    aliases: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def names(self) -> frozenset[str]:
        return frozenset((self.tensor, *self.aliases))

    def __str__(self) -> str:
        arrow = "CPU→WebGPU" if self.kind == "MemcpyFromHost" else "WebGPU→CPU"
        readers = ", ".join(self.consumers) or "?"
        return f"{self.kind} ({arrow}) on {self.tensor!r}: {self.producer or '?'} → {readers}"


@dataclasses.dataclass
class Placement:
    """Node placement of one model for one WebGPU configuration."""

    model: str
    graph_capture: bool
    method: str  # "static" | "probe"
    loads: bool = True
    load_error: str | None = None
    cpu_nodes: dict[str, str] = dataclasses.field(default_factory=dict)  # node name -> why on CPU
    memcpy: list[Memcpy] = dataclasses.field(default_factory=list)
    control_flow: list[str] = dataclasses.field(default_factory=list)
    capture_ok: bool | None = None  # session with enableGraphCapture=1 can be created (None: capture not asked)
    capture_error: str | None = None
    merged_nodes: list[str] = dataclasses.field(default_factory=list)  # duplicates onnxruntime's CSE removes
    runtime: str = ""  # the runtime target predicted for ("static"), or probed ("probe", when known)
    #: nodes the static rules cannot place (an element type or an (op, type) they do not know): node -> why. With
    #: any of these and no certain blocker, the capture verdict is unknown (``capture_ok`` None)
    unknown: dict[str, str] = dataclasses.field(default_factory=dict)
    #: nodes onnxruntime may constant-fold before placing (:func:`maybe_folded`): node -> why
    maybe_folded: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def memcpy_set(self) -> set[tuple[str, str]]:
        return {(m.kind, m.tensor) for m in self.memcpy}

    def same_memcpy(self, other: Placement) -> bool:
        """Same Memcpy nodes as ``other``, where a tensor merged by onnxruntime's CSE may go by any of its names."""
        if len(self.memcpy) != len(other.memcpy):
            return False
        left = list(other.memcpy)
        for mine in self.memcpy:
            match = next((m for m in left if m.kind == mine.kind and (m.names & mine.names)), None)
            if match is None:
                return False
            left.remove(match)
        return True

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["memcpy"] = [dataclasses.asdict(m) for m in self.memcpy]
        return d

    @property
    def state(self) -> str:
        """``"does-not-load"``, ``"blocked"`` (capture refused), ``"ready"`` (capture works), ``"unknown"`` (the
        static rules cannot tell: run the runtime, ``check --graph-capture``), or ``"loads"`` (capture not asked)."""
        if not self.loads:
            return "does-not-load"
        if not self.graph_capture:
            return "loads"
        if self.capture_ok is None:
            return "unknown"
        return "ready" if self.capture_ok else "blocked"

    def blockers(self) -> list[tuple[str, str]]:
        """What stops capture, each with its node: (node, why) for each control-flow node, then for each Memcpy the
        node on the CPU side of it (the producer of a ``MemcpyFromHost``, the reader of a ``MemcpyToHost``)."""
        out = [(name, "control flow: onnxruntime refuses graph capture with If/Loop/Scan") for name in self.control_flow]
        for m in self.memcpy:
            cpu_side = m.producer if m.kind == "MemcpyFromHost" else (m.consumers[0] if m.consumers else "")
            out.append((cpu_side or m.tensor, str(m)))
        return out

    def verdict(self) -> str:
        """One line for ``inspect``: ``does not load: ...`` / ``loads; capture-ready`` / ``loads; capture blocked
        by ...`` / ``loads; capture unknown: ...`` (with capture on), or ``loads; N Memcpy`` (capture not asked)."""
        state = self.state
        if state == "does-not-load":
            return f"does not load: {self.load_error}"
        if state == "loads":
            return f"loads; {len(self.memcpy)} Memcpy"
        if state == "ready":
            return "loads; capture-ready (0 Memcpy)"
        if state == "unknown":
            return f"loads; capture {self.unknown_line()}"
        if self.control_flow:
            return f"loads; capture blocked by control flow ({', '.join(self.control_flow[:2])})"
        first = self.memcpy[0] if self.memcpy else None
        where = f", e.g. {first.kind} on {first.tensor!r}" if first else ""
        return f"loads; capture blocked by {len(self.memcpy)} Memcpy{where}"

    def unknown_line(self) -> str:
        """``unknown: run `rope-passes check --graph-capture` (...)``: why the static rules cannot decide."""
        name, why = next(iter(self.unknown.items()), ("?", "?"))
        more = f" and {len(self.unknown) - 1} more" if len(self.unknown) > 1 else ""
        return (f"unknown: run `rope-passes check --graph-capture` (the static rules cannot place {len(self.unknown)} "
                f"node(s), e.g. {name}: {why}{more})")

    def summary(self) -> str:
        if not self.loads:
            return f"does not load: {self.load_error}"
        capture = ""
        if self.graph_capture:
            if self.capture_ok is None:
                capture = f"; capture {self.unknown_line()}"
            else:
                capture = "; capture: OK" if self.capture_ok else f"; capture refused: {self.capture_error}"
        unknown = f", {len(self.unknown)} unknown" if self.unknown else ""
        return f"{len(self.cpu_nodes)} node(s) on CPU{unknown}, {len(self.memcpy)} Memcpy{capture}"
