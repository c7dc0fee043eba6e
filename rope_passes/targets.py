"""The old home of the runtime facts, now in :mod:`rope_passes.runtimes` (issue 33: one word per concept): the
probed table is :class:`~rope_passes.runtimes.probed.ProbedRuntime` (was ``RuntimeTarget``, from ``get_target``),
what is installed :mod:`rope_passes.runtimes.installed`, the one choice :func:`rope_passes.runtimes.choose.resolve`
(was ``resolve_target``). The old names stay importable from here for code written against them.
"""

from rope_passes.runtimes.choose import resolve as resolve_target
from rope_passes.runtimes.descriptors import WEB, WEBGPU_127, WEBGPU_PLUGIN
from rope_passes.runtimes.installed import (
    DEFAULT_RUNTIME,
    DISTRIBUTIONS,
    RUNTIMES,
    Installed,
    default_runtime,
    detect_installed,
)
from rope_passes.runtimes.probed import (
    DOWNLEVEL,
    INEXACT_PASSES,
    MS,
    OPTION_PASSES,
    Downlevel,
    LoadProblem,
    from_table,
)
from rope_passes.runtimes.probed import ProbedRuntime as RuntimeTarget
from rope_passes.runtimes.probed import probed_runtime as get_target

__all__ = ["DEFAULT_RUNTIME", "DISTRIBUTIONS", "DOWNLEVEL", "INEXACT_PASSES", "MS", "OPTION_PASSES", "RUNTIMES", "WEB",
           "WEBGPU_127", "WEBGPU_PLUGIN", "Downlevel", "Installed", "LoadProblem", "RuntimeTarget", "default_runtime",
           "detect_installed", "from_table", "get_target", "resolve_target"]
