"""The docs say true things where a test can read both sides (issue 17).

* README's layout table names every top-level module and package of ``rope_passes``, and every path it names exists;
* docs/graph-capture.md's ``webgpu-graph`` table is :data:`rope_passes.plan.PRESETS` in order;
* the names the docs (README, docs/**) quote in backticks are real: a path (``rope_passes/io/load.py``, ``passes/_rewrite.py``,
  ``census.py``) exists, a dotted name that starts with a rope_passes module or class (``plan.PRESETS``,
  ``core.check``, ``PassReport.record``, ``rope_passes.runtime.sessions.create_session(model, ep)``) is defined
  there. Read from the source with ``ast``: nothing is imported, so the check costs no start-up.
* docs/runtimes.md: every onnxruntime session comes from ``runtime/sessions.py`` - no ``InferenceSession(`` call in
  the package outside it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from conftest import REPO
from test_architecture import _session_calls

PACKAGE = REPO / "rope_passes"
#: every doc of the repository: each quoted path and rope_passes name in it is checked
ALL_DOCS = sorted(str(p.relative_to(REPO)) for p in [*REPO.glob("*.md"), *REPO.glob("docs/**/*.md")])
#: docs that quote many names: the checker must find them (a broken checker does not pass silently)
MAIN_DOCS = ["README.md", "docs/architecture.md", "docs/runtimes.md", "docs/graph-capture.md"]
#: folders a quoted relative path may be relative to
PATH_ROOTS = (REPO, PACKAGE)
#: variables the docs use for objects of a rope_passes class (``report.record(failure)`` in "Adding a pass")
VARIABLES = {"report": ("PassReport", "PipelineReport", "EquivalenceReport"), "target": ("ProbedRuntime",),
             "static": ("Placement",), "probe": ("Placement",)}
#: quoted on purpose as names that do not exist (the template of a new pass)
PLACEHOLDERS = ("my_pass", "my-pass", "MyPass")


def _text_without_code_blocks(path: Path) -> str:
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def _quoted(doc: str) -> list[str]:
    return sorted(set(re.findall(r"`([^`\n]+)`", _text_without_code_blocks(REPO / doc))))


# ------------------------------------------------------------------------------------------------ README layout


def _layout_rows() -> list[list[str]]:
    """The first-column paths of each row of README's ``## Layout`` table."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout"):]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            rows.append(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return rows


def test_readme_layout_paths_exist():
    rows = _layout_rows()
    assert len(rows) >= 10, rows
    missing = [p for row in rows for p in row if not (REPO / p).exists()]
    assert not missing, f"README's layout table names paths that do not exist: {missing}"
    not_dirs = [p for row in rows for p in row if p.endswith("/") and not (REPO / p).is_dir()]
    assert not not_dirs, not_dirs


def test_readme_layout_names_every_top_level_module_and_package():
    listed = {p.rstrip("/") for row in _layout_rows() for p in row}
    ours = {f"rope_passes/{p.name}" for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").is_file())}
    ours |= {f"rope_passes/{p.name}" for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.json"))}
    assert ours - listed == set(), f"README's layout table lacks {sorted(ours - listed)}"
    # the finder sees what it looks for
    assert {"rope_passes/io", "rope_passes/runtime", "rope_passes/api.py", "rope_passes/runtime_tables"} <= ours


# ------------------------------------------------------------------------------------------------ preset table


def test_graph_capture_preset_table_is_the_preset():
    from rope_passes.plan import PRESETS

    text = (REPO / "docs" / "graph-capture.md").read_text(encoding="utf-8")
    section = text[text.index("## The `webgpu-graph` preset, in order"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1:3] for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
    assert [name.strip().strip("`") for _, name in rows] == PRESETS["webgpu-graph"]


# ------------------------------------------------------------------------------------------------ quoted names


@functools.cache
def _strings() -> frozenset[str]:
    """Every string literal of the package: metadata keys, initializer names, JSON keys the docs quote."""
    return frozenset(node.value for path in PACKAGE.rglob("*.py")
                     for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str))


@functools.cache
def _index() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> top-level names, class -> attribute names) of every module of the package, from ``ast``."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = modules.setdefault(name, set())
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if node.name == "__getattr__":  # lazy exports: the names it answers for
                    names.update(c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                                 and isinstance(c.value, str) and c.value.isidentifier())
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            if isinstance(node, ast.ClassDef):
                attrs = classes.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        attrs.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        attrs.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for name in list(modules):  # a package's submodules are its names too
        if "." in name:
            parent, _, child = name.rpartition(".")
            modules.setdefault(parent, set()).add(child)
    return modules, classes


def _resolves(dotted: str) -> bool | None:
    """True / False for a name that starts with a rope_passes module, class or doc variable; None for others."""
    modules, classes = _index()
    parts = dotted.split(".")
    known = False
    for i in range(len(parts), 0, -1):  # the longest module prefix: rope_passes.x.y, or a suffix of one (core.check)
        prefix = ".".join(parts[:i])
        for module in (m for m in modules if m == prefix or m.endswith("." + prefix)):
            known = True
            rest = parts[i:]
            if rest and f"{module}.{rest[0]}" in modules:
                continue  # a submodule: the longer prefix decided
            if not rest or (rest[0] in modules[module] and _attr_chain(rest, module)):
                return True
    heads = [h for h in VARIABLES.get(parts[0], (parts[0],)) if h in classes]
    if heads:
        return len(parts) == 1 or any(parts[1] in classes[h] for h in heads)
    if not known:
        return None
    # a module's name used for something else: a key the code spells out (``rope_passes.webgpu_only``,
    # ``config.model_attributes``), or a variable of that name (``census.inv_freq_product``: a RopeCensus field)
    strings = _strings()
    return dotted in strings or parts[-1] in strings or any(parts[-1] in attrs for attrs in classes.values())


def _attr_chain(rest: list[str], module: str) -> bool:
    """``Class.attr`` after a module: the attribute must be the class's (one level is what the docs quote)."""
    _, classes = _index()
    return len(rest) == 1 or rest[0] not in classes or rest[1] in classes[rest[0]]


def _path_exists(token: str) -> bool:
    pattern = token.replace("<runtime>", "*")
    if any(any(root.glob(pattern)) if "*" in pattern else (root / pattern).exists() for root in PATH_ROOTS):
        return True
    folder, _, leaf = pattern.rpartition("/")  # ``passes/_concat_offset.pack_qkv``: a module's name
    module, _, name = leaf.partition(".")
    if name and "." not in name:
        for root in PATH_ROOTS:
            source = root / folder / f"{module}.py"
            if source.is_file():
                return name in {n.name for n in ast.parse(source.read_text(encoding="utf-8")).body
                                if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
                    t.id for n in ast.parse(source.read_text(encoding="utf-8")).body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
    return False


def _ours(path: str) -> bool:
    """A path into this repository (its first folder is one of it or of the package), not a corpus-relative name
    (``hf/llama/ref_S8.npy``) or a formula (``rotary_dim/2``)."""
    first = path.split("/", 1)[0]
    return bool(first) and any((root / first).exists() or (root / f"{first}.py").exists() for root in PATH_ROOTS)


@pytest.mark.parametrize("doc", ALL_DOCS)
def test_quoted_paths_and_names_are_real(doc):
    wrong = []
    checked = 0
    for token in _quoted(doc):
        word = token.removeprefix("raise ").split("(")[0].split(" ")[0]
        if any(p in word for p in PLACEHOLDERS) or word.startswith((".", "current/", "legacy/", "tests/fixtures/")) \
                or not word:
            continue  # a template, a hidden file, a corpus model or fixture (reading those is a corpus test's)
        if "/" in word and re.fullmatch(r"[\w./<>*-]+", word):
            if not _ours(word):
                continue
            checked += 1
            if not _path_exists(word.rstrip("/")):
                wrong.append(f"{token}: no such path")
        elif re.fullmatch(r"\w+\.py", word):
            checked += 1
            if not any(PACKAGE.rglob(word)):
                wrong.append(f"{token}: no such module in rope_passes")
        elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", word) and not word.endswith((".json", ".md", ".npy")):
            verdict = _resolves(word)
            checked += verdict is not None
            if verdict is False:
                wrong.append(f"{token}: not defined in rope_passes")
    assert not wrong, f"{doc} quotes names that do not exist:\n" + "\n".join(wrong)
    assert checked >= 5 or doc not in MAIN_DOCS, f"{doc}: the checker found almost nothing to check ({checked})"


def test_the_name_checker_finds_what_does_not_exist():
    assert _resolves("plan.PRESETS") and _resolves("core.check") and _resolves("PassReport.record")
    assert _resolves("rope_passes.runtime.sessions.create_session") and _resolves("Memcpy.aliases")
    assert _resolves("pipeline.PRESETZ") is False and _resolves("PassReport.recorded") is False
    assert _resolves("analysis.mrope.Evaluate") is False
    assert _resolves("SessionOptions.add_provider_for_devices") is None  # onnxruntime's: not ours to check
    assert not _path_exists("rope_passes/io.py") and _path_exists("rope_passes/io")
    assert _path_exists("passes/_rewrite.py") and _path_exists("rope_passes/runtime_tables/<runtime>.json")
    assert _path_exists("passes/_concat_offset.pack_qkv") and not _path_exists("passes/_concat_offset.pack_qvk")
    assert _ours("rope_passes/x.py") and not _ours("hf/llama/ref_S8.npy") and not _ours("rotary_dim/2")
    assert _resolves("rope_passes.webgpu_only") and _resolves("rope_passes.nothing_of_ours") is False


# ------------------------------------------------------------------------------------------------ runtimes.md


def test_every_session_is_opened_by_runtime_sessions():
    """docs/runtimes.md: every onnxruntime session comes from ``create_session`` (the placement probe's from
    ``open_session``, the unchecked form): the package's ``InferenceSession(`` calls are in ``runtime/sessions.py``
    alone, ``runtime/evaluate.py`` included."""
    sessions = PACKAGE / "runtime" / "sessions.py"
    offenders = [f"{path.relative_to(REPO)}:{line}" for path in PACKAGE.rglob("*.py") if path != sessions
                 for line in _session_calls(path)]
    assert not offenders, offenders
    assert "comes from `rope_passes.runtime.sessions.create_session" in (REPO / "docs/runtimes.md").read_text()
    assert len(_session_calls(sessions)) == 2  # open_session: the plugin form and the providers= form


def _preset_rows(path: Path) -> dict[str, list[str]]:
    from rope_passes.plan import PRESETS

    """`preset` -> the cells after it, for every table row of ``path`` whose first cell is a backticked preset."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].strip("`") in PRESETS and re.fullmatch(r"`[a-z-]+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_preset_tables_are_the_presets():
    """docs/passes/README.md and docs/runtimes.md list the presets per runtime: they are `plan.presets_for`."""
    from rope_passes.plan import presets_for
    from rope_passes.runtimes.descriptors import WEBGPU_127, WEBGPU_PLUGIN

    def arrows(names: list[str]) -> str:
        return " → ".join(names)

    old, plugin = presets_for(WEBGPU_127), presets_for(WEBGPU_PLUGIN)
    readme = _preset_rows(REPO / "docs" / "passes" / "README.md")
    assert {k: v[0] for k, v in readme.items()} == {k: arrows(v) for k, v in old.items()}
    runtimes = _preset_rows(REPO / "docs" / "runtimes.md")
    assert {k: v[:2] for k, v in runtimes.items()} == {k: [arrows(old[k]), arrows(plugin[k])] for k in old}
