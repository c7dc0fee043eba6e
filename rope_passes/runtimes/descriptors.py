"""The runtimes rope-passes optimizes for and checks on: one :class:`Runtime` descriptor each, the one place a
runtime's names, aliases, interpreter and check backend are written.

Light on purpose (no onnx_ir, no onnxruntime): the CLI's parsers build their ``--runtime`` choices from it, so
``--help`` imports nothing heavy. Who reads it:

* :mod:`.probed` (what a runtime loads, runs and reads, from ``runtime_tables/<name>.json``: a runtime with
  :attr:`Runtime.table` has one) and :mod:`.installed` (:attr:`Runtime.python`, :attr:`Runtime.distributions`);
* :mod:`rope_passes.cli` (``--runtime`` choices of optimize, lint, inspect and check);
* :mod:`.choose` (names and aliases resolved, ``--runtime all``), :func:`rope_passes.check.core.interpreter` and
  :mod:`rope_passes.check.backends` (:attr:`Runtime.backend`: the module that runs the checker's runs on it).

Adding a runtime: a descriptor in :data:`DESCRIPTORS`, and its backend module (docs/architecture.md, "Adding a
runtime").
"""

from __future__ import annotations

import dataclasses

#: the backend of the runtimes that are an onnxruntime Python installation (sessions from runtime.sessions)
NATIVE_BACKEND = "rope_passes.check.backends.native"


@dataclasses.dataclass(frozen=True)
class Python:
    """Where a Python runtime's interpreter is: ``$variable``, else ``<repo>/<venv>/bin/python``, made by
    ``setup``."""

    variable: str
    venv: str
    setup: str


@dataclasses.dataclass(frozen=True)
class Runtime:
    """One runtime: what the command line calls it and what runs a check's sessions on it."""

    name: str
    summary: str
    #: other names ``check --runtime`` accepts for it
    aliases: tuple[str, ...] = ()
    #: the Python distributions that make it up (:func:`.installed.detect_installed` looks for them); empty
    #: for a runtime that is no Python installation
    distributions: tuple[str, ...] = ()
    #: its interpreter, for a Python runtime (None: its WebGPU runs are driven from this process, its CPU runs are
    #: onnxruntime's CPU EP here)
    python: Python | None = None
    #: the module of its check backend (:mod:`rope_passes.check.backends`), imported when a check runs on it
    backend: str = NATIVE_BACKEND
    #: a probed table ``runtime_tables/<name>.json``: ``optimize``/``lint``/``inspect --runtime`` may name it
    table: bool = True
    #: ``check --runtime all`` checks on it
    in_all: bool = False
    #: onnxruntime-genai runs on its sessions: a capture the output's genai_config turns on is part of a check
    genai: bool = False
    #: where an original that does not load on it runs instead (None: nowhere)
    fallback: str | None = None


WEBGPU_127 = "onnxruntime-webgpu"
WEBGPU_PLUGIN = "onnxruntime-ep-webgpu"
WEB = "onnxruntime-web"
ORT_NODE = "onnxruntime-node"

DESCRIPTORS: tuple[Runtime, ...] = (
    Runtime(WEBGPU_127, "PyPI onnxruntime-webgpu (1.27): the onnxruntime module with WebGPU built in",
            distributions=("onnxruntime-webgpu",),
            python=Python("ROPE_PASSES_WEBGPU_PYTHON", ".venv", "scripts/setup.sh"),
            in_all=True, genai=True, fallback=WEBGPU_PLUGIN),
    Runtime(WEBGPU_PLUGIN, "PyPI onnxruntime (>= 1.31) + onnxruntime-ep-webgpu (the WebGPU plugin EP library)",
            distributions=("onnxruntime", "onnxruntime-ep-webgpu"),
            python=Python("ROPE_PASSES_PLUGIN_PYTHON", ".venv-plugin", "scripts/setup-plugin-runtime.sh"),
            in_all=True, genai=True),
    Runtime(WEB, "npm onnxruntime-web (1.30) in headless Chromium, or its bundle on Dawn for Node for a float16 graph "
                 "the page's adapter cannot run (scripts/setup-web-runtime.sh)",
            aliases=("web",), backend="rope_passes.check.backends.web", fallback=WEBGPU_PLUGIN),
    Runtime(ORT_NODE, "npm onnxruntime-node (1.30): onnxruntime's native WebGPU EP in Node (scripts/setup-web-runtime.sh)",
            backend="rope_passes.check.backends.node", fallback=WEBGPU_PLUGIN),
)

#: name -> descriptor, aliases included
_BY_NAME = {n: r for r in DESCRIPTORS for n in (r.name, *r.aliases)}


def descriptor(name: str) -> Runtime | None:
    """The runtime called ``name`` (its name or an alias), or None."""
    return _BY_NAME.get(name)


def python_runtimes() -> tuple[str, ...]:
    """The runtimes that are a Python installation, in the order they are shown."""
    return tuple(r.name for r in DESCRIPTORS if r.python is not None)


def with_tables() -> tuple[str, ...]:
    """The runtimes with a probed table (``optimize``/``lint``/``inspect --runtime``)."""
    return tuple(r.name for r in DESCRIPTORS if r.table)


def check_names() -> tuple[str, ...]:
    """Every name ``check --runtime`` accepts for a runtime (aliases after the name), in the order shown."""
    return tuple(n for r in DESCRIPTORS for n in ((*r.aliases, r.name) if r.aliases else (r.name,)))


__all__ = ["DESCRIPTORS", "NATIVE_BACKEND", "ORT_NODE", "WEB", "WEBGPU_127", "WEBGPU_PLUGIN", "Python", "Runtime", "check_names",
           "descriptor", "python_runtimes", "with_tables"]
