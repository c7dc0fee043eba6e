"""Start-up: ``rope-passes --help``, every command's ``--help`` and usage errors import nothing heavy; ``lint``
imports what linting needs only (issue 17: a pre-commit hook pays the start-up on every commit).

Each case runs the command line in a fresh interpreter and lists the heavy modules in ``sys.modules`` at exit
(``-X importtime`` would give the same, noisier). No timing here: the CPU seconds are bench/run_all's start-up rows
and docs/performance.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rope_passes.cli import COMMANDS

#: what costs start-up time: onnx_ir (and the sympy it imports eagerly), onnx, onnxscript, onnxruntime, numpy, rich
HEAVY = ("onnx_ir", "sympy", "onnx", "onnxscript", "onnxruntime", "numpy", "rich")

_PROBE = """
import json, sys
from rope_passes.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:  # argparse's --help and usage errors
    code = exc.code
sys.stdout.flush()
print("\\n@@" + json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
""".replace("HEAVY", repr(HEAVY))


def imported(*argv: str) -> tuple[int, set[str]]:
    """(exit code, heavy top-level modules imported) of ``rope-passes ARGV`` in a fresh interpreter."""
    p = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(argv))], capture_output=True, text=True,
                       timeout=120)
    assert "@@" in p.stdout, p.stderr[-2000:]
    result = json.loads(p.stdout.rsplit("@@", 1)[1])
    return result["code"], {m.split(".")[0] for m in result["modules"]}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], *[[c, "--help"] for c in COMMANDS]],
                         ids=lambda a: " ".join(a) or "(none)")
def test_help_imports_nothing_heavy(argv):
    code, heavy = imported(*argv)
    assert code in (0, 2)
    assert not heavy, f"rope-passes {' '.join(argv)} imported {sorted(heavy)}"


@pytest.mark.parametrize("argv", [
    ["no-such-command"],
    ["optimize"],  # the input is missing
    ["optimize", "m.onnx", "--target", "nope"],
    ["optimize", "m.onnx", "--weights", "nope"],
    ["lint", "--format", "nope"],
    ["lint", "--fail-on", "nope"],
    ["inspect"],
    ["inspect", "m.onnx", "--runtime", "nope"],
    ["check", "only-one"],
    ["check", "a", "b", "--runtime", "nope"],
    ["demo", "--steps", "many"],
], ids=" ".join)
def test_usage_errors_import_nothing_heavy(argv):
    code, heavy = imported(*argv)
    assert code == 2
    assert not heavy, f"rope-passes {' '.join(argv)} imported {sorted(heavy)}"


def test_lint_imports_what_linting_needs(tmp_path):
    """onnx_ir (and with it sympy, onnx, numpy) to read the graph; not onnxscript's rewriter (only a LongRoPE
    If/Where switch needs it) nor onnxruntime (no rule runs a session) nor the passes."""
    from rope_passes.demo import build_tiny_decoder

    model = build_tiny_decoder(tmp_path / "tiny")
    code, heavy = imported("lint", str(model))
    assert code in (0, 1)
    assert "onnx_ir" in heavy  # it did lint
    assert not heavy & {"onnxscript", "onnxruntime", "rich"}, sorted(heavy)


def test_lint_list_rules_reads_no_model():
    code, heavy = imported("lint", "--list-rules")
    assert code == 0
    assert not heavy & {"onnxscript", "onnxruntime", "rich"}, sorted(heavy)


def test_spelled_out_choices_agree_with_their_sources():
    """The parsers spell out a few choice lists (importing their sources would import onnx_ir): they must stay the
    same lists."""
    from rope_passes import cli
    from rope_passes.cli import check_cmd, lint_cmd, optimize_cmd
    from rope_passes.io import WEIGHT_MODES
    from rope_passes.lint.core import Severity
    from rope_passes.lint.formats import FORMATS
    from rope_passes.plan import PRESETS
    from rope_passes.runtimes.choose import CHOICES
    from rope_passes.runtimes.installed import RUNTIMES

    assert tuple(RUNTIMES) == cli.RUNTIMES
    from rope_passes.runtimes.descriptors import WEB

    assert WEB in cli.TABLE_RUNTIMES
    assert tuple(CHOICES) == check_cmd.RUNTIME_CHOICES
    assert set(lint_cmd.FORMAT_NAMES) == set(FORMATS)
    assert set(lint_cmd.SEVERITIES) == {s.value for s in Severity} == set(lint_cmd.ORDER)
    assert set(cli.PRESET_NAMES) == set(PRESETS)
    assert tuple(optimize_cmd.WEIGHT_MODES) == tuple(WEIGHT_MODES)


def test_the_package_imports_nothing_heavy():
    p = subprocess.run([sys.executable, "-c", "import sys, rope_passes, rope_passes.cli; "
                        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr
