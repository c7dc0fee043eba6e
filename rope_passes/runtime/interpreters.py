"""The old home of which Python interpreter runs which WebGPU runtime: :mod:`rope_passes.runtimes.installed`
(issue 33). The names stay importable from here."""

from rope_passes.runtimes.installed import PYTHON_ENV, REPO, child_env, python_for

__all__ = ["PYTHON_ENV", "REPO", "child_env", "python_for"]
