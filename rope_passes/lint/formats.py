"""Lint output formats: text, JSON, GitHub workflow annotations, SARIF 2.1.0."""

from __future__ import annotations

import json
from typing import Any

from rope_passes import __version__
from rope_passes.lint.core import RULES, Diagnostic, Severity

GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}
SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}


def as_text(results: dict[str, list[Diagnostic]]) -> str:
    lines = []
    for path, diags in results.items():
        for d in diags:
            fix = f" [fix: {d.fix_command}]" if d.fix else ""
            lines.append(f"{path}: {d.code} {d.severity}: {d.message} ({d.target}){fix}")
    n = sum(len(d) for d in results.values())
    lines.append(f"{n} problem{'s' if n != 1 else ''} in {len(results)} model{'s' if len(results) != 1 else ''}")
    return "\n".join(lines)


def as_json(results: dict[str, list[Diagnostic]]) -> str:
    return json.dumps({path: [d.to_dict() for d in diags] for path, diags in results.items()}, indent=2)


def _escape_github(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF escaped (GitHub's ``escapeData``)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_github_property(text: str) -> str:
    """A workflow command's property value (``file=``, ``title=``): also ``:`` and ``,`` (GitHub's
    ``escapeProperty``), which would otherwise end the value."""
    return _escape_github(text).replace(":", "%3A").replace(",", "%2C")


def _model_file(path: str) -> str:
    """The ``.onnx`` file a linted path stands for: a folder's decoder model (what its ``genai_config.json`` names),
    so an annotation lands on a file of the pull request, not on a folder GitHub cannot show."""
    from rope_passes.errors import ModelLoadError
    from rope_passes.io.load import resolve_model_path

    try:
        return str(resolve_model_path(path)[0])
    except ModelLoadError:  # gone since it was linted: the path as given
        return path


def as_github(results: dict[str, list[Diagnostic]]) -> str:
    """One ``::error|warning|notice file=<model .onnx>,title=<code name>::<node>: <message>`` line per finding; the
    node (or value) in the message keeps two findings of one rule at two nodes apart (GitHub shows each)."""
    lines = []
    for path, diags in results.items():
        file = _escape_github_property(_model_file(path)) if diags else ""
        for d in diags:
            title = f"{d.code} {RULES[d.code].name}" if d.code in RULES else d.code
            msg = f"{d.target}: {d.message}" + (f" (fix: rope-passes optimize --passes {d.fix_command})"
                                                if d.fix else "")
            lines.append(f"::{GITHUB_LEVEL[d.severity]} file={file},title={_escape_github_property(title)}::"
                         f"{_escape_github(msg)}")
    return "\n".join(lines)


def as_sarif(results: dict[str, list[Diagnostic]]) -> str:
    rules: list[dict[str, Any]] = [
        {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": r.explanation},
            "help": {"text": r.explanation + (f" Fix: rope-passes optimize --passes {r.fix} {r.fix_flag}".rstrip() if r.fix else "")},
            "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]},
        }
        for r in sorted(RULES.values(), key=lambda r: r.code)
    ]
    index = {r["id"]: i for i, r in enumerate(rules)}
    sarif_results = []
    for path, diags in results.items():
        uri = _model_file(path) if diags else path  # an artifact is a file: the folder's decoder model
        for d in diags:
            sarif_results.append({
                "ruleId": d.code,
                "ruleIndex": index[d.code],
                "level": SARIF_LEVEL[d.severity],
                "message": {"text": d.message},
                "locations": [{
                    "physicalLocation": {"artifactLocation": {"uri": uri}},
                    "logicalLocations": [{"name": d.target, "kind": "member"}],
                }],
            })
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "rope-passes", "version": __version__, "rules": rules}},
            "results": sarif_results,
        }],
    }
    return json.dumps(doc, indent=2)


FORMATS = {"text": as_text, "json": as_json, "github": as_github, "sarif": as_sarif}
