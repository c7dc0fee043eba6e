"""The runtimes: one home for every fact about a WebGPU runtime rope-passes optimizes for or checks on.

* :mod:`.descriptors`: one :class:`Runtime` each (names, aliases, interpreter, check backend); light, re-exported
  here (the CLI's parsers read it, so ``--help`` imports nothing heavy);
* :mod:`.installed`: which runtime is installed beside rope-passes (package metadata only) and which Python
  interpreter runs which runtime;
* :mod:`.probed`: what one runtime loads, runs on WebGPU and reads, from its probed table (:class:`.probed.
  ProbedRuntime`), and the downlevel passes it needs;
* :mod:`.choose`: the one :func:`.choose.resolve` from a name (or None: the runtime installed here) to its table.

Importing this package imports :mod:`.descriptors` only.
"""

from rope_passes.runtimes.descriptors import (
    DESCRIPTORS,
    NATIVE_BACKEND,
    ORT_NODE,
    WEB,
    WEBGPU_127,
    WEBGPU_PLUGIN,
    Python,
    Runtime,
    check_names,
    descriptor,
    python_runtimes,
    with_tables,
)

__all__ = ["DESCRIPTORS", "NATIVE_BACKEND", "ORT_NODE", "WEB", "WEBGPU_127", "WEBGPU_PLUGIN", "Python", "Runtime", "check_names",
           "descriptor", "python_runtimes", "with_tables"]
