"""The set-up scripts on a machine that is already set up: nothing is installed twice.

``scripts/demo.sh`` then ``scripts/test.sh`` (the README's two commands) both run ``scripts/setup.sh``; the second run
must find the venv up to date by its stamp (the hash of pyproject.toml and setup.sh) and install nothing. The venv
here is a stand-in whose ``python`` runs this interpreter but refuses ``-m pip``, so an install attempt fails loudly
instead of touching the real venv. setup.sh's up-to-date check also imports ``onnxruntime_genai``, which the ``test``
extra does not install (onnxruntime-genai pulls its own onnxruntime, which would replace the WebGPU one): where this
interpreter lacks it, the stand-in sees an empty stub, so the tests pass on a checkout set up with
``pip install -e .[test]`` as on one set up by setup.sh.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stand_in_venv(root: Path) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    stubs = ""
    if importlib.util.find_spec("onnxruntime_genai") is None:
        (root / "stubs").mkdir()
        (root / "stubs" / "onnxruntime_genai.py").write_text("")
        stubs = f'PYTHONPATH="{root / "stubs"}:$PYTHONPATH" '
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = -m ] && [ "$2" = pip ] && {{ echo "pip called: $*" >&2; exit 97; }}\n'
                      f'{stubs}exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return venv


def _run_setup(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VENV": str(venv)}
    env.pop("ROPE_PASSES_SETUP", None)
    return subprocess.run(["bash", "scripts/setup.sh", "--no-driver"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_an_up_to_date_venv_is_not_reinstalled(tmp_path):
    venv = _stand_in_venv(tmp_path)
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "scripts" / "setup.sh").read_bytes())
    (venv / ".rope-passes-setup").write_text(digest.hexdigest() + "\n")
    done = _run_setup(venv)
    assert done.returncode == 0, done.stderr
    assert "is up to date" in done.stdout and "pip called" not in done.stderr
    assert not (venv / "pip-install.log").exists()


def test_a_stale_stamp_reinstalls(tmp_path):
    venv = _stand_in_venv(tmp_path)
    (venv / ".rope-passes-setup").write_text("0" * 64 + "\n")  # set up from other inputs
    done = _run_setup(venv)
    assert done.returncode != 0 and "pip called: -m pip install" in (venv / "pip-install.log").read_text() + done.stderr
