"""The one choice of a runtime: a name (or None: the runtime installed here) resolved to its probed table, once, at
the edge (:func:`rope_passes.plan.make_plan`); below it every ``runtime`` is a :class:`.probed.ProbedRuntime`."""

from __future__ import annotations

from rope_passes.runtimes.installed import default_runtime
from rope_passes.runtimes.probed import ProbedRuntime, probed_runtime


def resolve(runtime: ProbedRuntime | str | None = None) -> ProbedRuntime:
    """A runtime's table from the table, its name, or None (the runtime installed here:
    :func:`.installed.default_runtime`)."""
    if isinstance(runtime, ProbedRuntime):
        return runtime
    return probed_runtime(runtime or default_runtime())


__all__ = ["resolve"]
