"""Where the browser runtime's set-up put things (``scripts/setup-web-runtime.sh``), and what is missing.

* ``.web-runtime/node_modules`` (``$ROPE_PASSES_WEB_RUNTIME`` overrides the folder): the pinned npm packages;
* Debian's Chromium at ``/usr/bin/chromium`` (``$ROPE_PASSES_CHROMIUM`` overrides it).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

from rope_passes.errors import RopePassesError

REPO = Path(__file__).resolve().parents[3]
#: the npm folder of scripts/setup-web-runtime.sh (package.json + package-lock.json committed)
WEB_RUNTIME_ENV, CHROMIUM_ENV = "ROPE_PASSES_WEB_RUNTIME", "ROPE_PASSES_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"


class WebRuntimeUnavailable(RopePassesError):
    """The browser runtime is not set up here (no chromium, no node, no .web-runtime/node_modules)."""


def web_runtime_dir() -> Path:
    return Path(os.environ.get(WEB_RUNTIME_ENV) or REPO / ".web-runtime")


def chromium_path() -> str:
    return os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM


#: the hosts of onnxruntime's JS packages: where the driver runs them (:mod:`.browser`)
CHROMIUM, DAWN, ORT_NODE = "chromium", "dawn", "onnxruntime-node"
HOSTS = (CHROMIUM, DAWN, ORT_NODE)
#: the npm packages each host needs, and the file of each that must be there (an install script that did not run
#: leaves onnxruntime-node without its binary: its package.json alone is no proof)
PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    CHROMIUM: (("onnxruntime-web", "package.json"), ("playwright-core", "package.json")),
    DAWN: (("onnxruntime-web", "package.json"), ("webgpu", "dist/linux-x64/dawn.node")),
    ORT_NODE: (("onnxruntime-node", "bin/napi-v6/linux/x64/onnxruntime_binding.node"),),
}


def missing(host: str = CHROMIUM) -> str | None:
    """Why ``host`` cannot start here (None: it can), with the command that sets it up."""
    setup = "run scripts/setup-web-runtime.sh"
    if shutil.which("node") is None:
        return f"no node (Node.js) on PATH: install Node.js >= 18, then {setup}"
    modules = web_runtime_dir() / "node_modules"
    for package, file in PACKAGES[host]:
        if not (modules / package / "package.json").is_file():
            return f"{modules / package} is missing: {setup}"
        if not (modules / package / file).is_file():
            return f"{modules / package / file} is missing: {setup}"
    if host == CHROMIUM:
        chromium = chromium_path()
        if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
            return f"no chromium at {chromium}: {setup} (apt-get install chromium), or set ${CHROMIUM_ENV}"
    return None


@functools.cache
def package_version(name: str) -> str:
    path = web_runtime_dir() / "node_modules" / name / "package.json"
    try:
        return str(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "?"


__all__ = ["CHROMIUM", "CHROMIUM_ENV", "DAWN", "DEFAULT_CHROMIUM", "HOSTS", "ORT_NODE", "PACKAGES", "WEB_RUNTIME_ENV", "WebRuntimeUnavailable", "chromium_path", "missing",
           "package_version", "web_runtime_dir"]
