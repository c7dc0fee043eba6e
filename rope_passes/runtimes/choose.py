"""The one choice of a runtime: a name (or None: the runtime installed here) resolved once, at the edge, to its
descriptor (:func:`runtime_of`: ``check --runtime``) or its probed table (:func:`resolve`:
:func:`rope_passes.plan.make_plan`); below the edge every ``runtime`` is one of them. ``check --runtime all``:
:func:`runtimes_for`, one check per Python runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rope_passes.errors import UsageError
from rope_passes.runtimes.descriptors import DESCRIPTORS, Runtime, check_names, descriptor
from rope_passes.runtimes.installed import default_runtime, python_for

if TYPE_CHECKING:
    from rope_passes.runtimes.probed import ProbedRuntime

#: ``--runtime all``: every runtime whose descriptor says so (the Python ones), one verdict each
ALL = "all"
#: what ``check --runtime`` accepts: every descriptor's names, then all
CHOICES = (*check_names(), ALL)


def resolve(runtime: ProbedRuntime | str | None = None) -> ProbedRuntime:
    """A runtime's table from the table, its name, or None (the runtime installed here:
    :func:`.installed.default_runtime`)."""
    from rope_passes.runtimes.probed import ProbedRuntime, probed_runtime

    if isinstance(runtime, ProbedRuntime):
        return runtime
    return probed_runtime(runtime or default_runtime())


def runtime_of(name: str | None) -> Runtime:
    """The descriptor of runtime ``name`` (None: the one installed here); a usage error for an unknown one."""
    found = descriptor(name or default_runtime())
    if found is None:
        raise UsageError(f"unknown runtime {name!r} (choose from: {', '.join(CHOICES)})")
    return found


def runtimes_for(choice: str | None) -> list[str]:
    """The runtimes ``--runtime choice`` checks on, in the order they are shown."""
    return [r.name for r in DESCRIPTORS if r.in_all] if choice == ALL else [runtime_of(choice).name]


def fallback_interpreter(runtime: str) -> str | None:
    """The interpreter of the runtime an original that does not load on ``runtime`` runs on (its descriptor's
    ``fallback``: the plugin EP's, for onnxruntime-webgpu and the browser); None when there is none."""
    fallback = runtime_of(runtime).fallback
    return None if fallback is None else python_for(fallback)


__all__ = ["ALL", "CHOICES", "fallback_interpreter", "resolve", "runtime_of", "runtimes_for"]
