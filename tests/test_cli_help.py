"""Every command's ``--help`` says what it does, documents each option once, and lists its exit codes (issue 17).

Read from the parser itself (``build_parser``), the same object ``rope-passes CMD --help`` prints, and from the
printed text for the exit-code section.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from rope_passes.cli import COMMANDS, build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_is_listed_with_a_summary():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}
    assert set(summaries) == set(COMMANDS)
    assert all(h and len(h) > 15 for h in summaries.values()), summaries


@pytest.mark.parametrize("name", COMMANDS)
def test_description(name):
    p = _commands()[name]
    assert p.description and len(p.description.split()) >= 12, f"{name}: no description: {p.description!r}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_one_help_line_and_no_repeated_default(name):
    p = _commands()[name]
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        what = f"{name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help and action.help != argparse.SUPPRESS, f"{what}: no help"
        text = action.help
        assert text.count("(default") + text.count("%(default)") <= 1, f"{what}: the default is stated twice: {text}"
        assert "\n" not in text, f"{what}: help of more than one line: {text!r}"


def _printed_help(*argv: str) -> str:
    p = subprocess.run([sys.executable, "-m", "rope_passes", *argv, "--help"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "100", "PATH": ""})
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_exit_codes(name):
    """0, 2 (usage error, unreadable model), 3 (internal error) and 130 (Ctrl-C), as cli.main returns them; 1 where
    the command has a "found something" outcome (check, lint, demo)."""
    text = _printed_help(*([name] if name else []))
    assert "\nexit codes:\n" in text, f"rope-passes {name} --help has no exit codes:\n{text}"
    section = text.split("\nexit codes:\n", 1)[1]
    codes = re.findall(r"^  (\d+)  ", section, flags=re.M)
    assert len(codes) == len(set(codes)), f"{name}: a code listed twice: {codes}"
    assert {"0", "2", "3", "130"} <= set(codes), f"{name}: {codes}"
    if name in ("check", "lint", "demo"):
        assert "1" in codes, f"{name}: {codes}"


@pytest.mark.parametrize("name", ["optimize", "lint"])
def test_the_pass_list_flag_is_preset_and_target_its_alias(name):
    """Issue 33 step 3 / issue 32: ``--preset`` names the pass list everywhere; ``--target``, what users already
    type, is the same flag, and the help says so."""
    parser = _commands()[name]
    action = next(a for a in parser._actions if a.dest == "preset")
    assert action.option_strings == ["--preset", "--target"]
    assert "--target is an alias" in (action.help or "")
    assert parser.parse_args(["m", "--target", "webgpu-graph"]).preset == "webgpu-graph"
    assert parser.parse_args(["m", "--preset", "exporter"]).preset == "exporter"
    text = parser.format_help()
    assert "--preset PRESET, --target PRESET" in text, text


def test_no_command_or_doc_names_the_preset_target():
    """The flag is --preset in every help text and every doc; --target appears only where the alias is stated."""
    from conftest import REPO

    for name, parser in _commands().items():
        for action in parser._actions:
            if action.dest != "preset":
                assert "--target" not in (action.help or ""), (name, action.dest)
        assert "--target" not in (parser.description or ""), name
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if re.search(r"--target\b", line):
                assert "alias" in line or "same flag" in line, (doc.name, line)
