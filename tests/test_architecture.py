"""The package's layering, read from the source with ``ast`` (every import statement, function-level ones included).

* ``rope_passes.analysis`` is pure graph reasoning: it never imports ``onnxruntime`` nor ``rope_passes.runtime``
  (the layer that owns every onnxruntime session).
* No module outside ``rope_passes.runtime`` creates an onnxruntime session (no ``InferenceSession(...)`` call, however
  spelled, and no ``from onnxruntime import InferenceSession``).
* The ``rope_passes`` modules import each other without cycles.
* ``rope_passes.proofs`` (the constant evaluator, the interval analysis, the cone accounting, the numeric evidence)
  sits below ``passes`` and ``lint``: it imports neither, nor anything above them (``pipeline``, ``api``, ``check``,
  ``cli``). ``lint`` reads proofs, never a pass's module; no pass module imports another pass module (private
  helpers in ``passes/`` that define no pass, like ``base.py`` and ``_rewrite.py``, are shared freely).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rope_passes"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported name, line) for every import in the file; ``from m import x`` gives ``m`` and ``m.x`` (x may be a
    submodule); relative imports are resolved."""
    is_package = path.name == "__init__.py"
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")
                parent = parent if is_package else parent[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            out.append((base, node.lineno))
            out.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*")
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the rope_passes modules it imports (the longest module prefix of each imported name)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for imported, _line in _imports(name, path):
            parts = imported.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
                          None)
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:
        start = min(component)
        # shortest path back to start inside the component (breadth-first)
        paths = {start: [start]}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w == start:
                        cycle = paths[v] + [start]
                        break
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        cycles.append(cycle or sorted(component))
    return cycles


def test_analysis_imports_no_onnxruntime_and_no_runtime_layer():
    offenders = []
    for name, path in _modules().items():
        if not (name == "rope_passes.analysis" or name.startswith("rope_passes.analysis.")):
            continue
        for imported, line in _imports(name, path):
            if imported.split(".")[0] == "onnxruntime" or _in(imported, "rope_passes.runtime"):  # not .runtimes
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not offenders, "analysis must stay pure (no sessions):\n" + "\n".join(sorted(set(offenders)))


def _session_calls(path: Path) -> list[int]:
    """Lines of ``<anything>.InferenceSession(...)`` / ``InferenceSession(...)`` calls and of imports of the name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "InferenceSession") or (
                    isinstance(func, ast.Name) and func.id == "InferenceSession"):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "onnxruntime":
            lines.extend(node.lineno for alias in node.names if alias.name == "InferenceSession")
    return lines


def test_only_the_runtime_layer_creates_sessions():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}"
                 for name, path in _modules().items()
                 if not (name == "rope_passes.runtime" or name.startswith("rope_passes.runtime."))
                 for line in _session_calls(path)]
    assert not offenders, ("onnxruntime sessions are created in rope_passes.runtime only "
                           "(rope_passes.runtime.sessions.create_session):\n" + "\n".join(offenders))
    # the finder finds what it looks for
    assert _session_calls(PACKAGE / "runtime" / "sessions.py")


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles among rope_passes modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _pass_modules() -> set[str]:
    """Modules under rope_passes.passes that define a pass (a class deriving from RopePass)."""
    out = set()
    for name, path in _modules().items():
        if not name.startswith("rope_passes.passes.") or name == "rope_passes.passes.base":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id == "RopePass") or (isinstance(b, ast.Attribute)
                                                                        and b.attr == "RopePass") for b in node.bases):
                out.add(name)
    return out


ABOVE_PROOFS = ("rope_passes.passes", "rope_passes.lint", "rope_passes.pipeline", "rope_passes.api",
                "rope_passes.check", "rope_passes.cli")


def test_proofs_import_nothing_above_them():
    graph = _import_graph()
    assert any(_in(m, "rope_passes.proofs") for m in graph), "rope_passes.proofs is missing"
    offenders = [f"{m} imports {t}" for m, targets in graph.items() if _in(m, "rope_passes.proofs")
                 for t in targets if any(_in(t, above) for above in ABOVE_PROOFS)]
    assert not offenders, "proofs sit below passes and lint:\n" + "\n".join(sorted(offenders))


def test_lint_imports_proofs_never_a_pass_module():
    """lint reads what the passes prove from rope_passes.proofs; the pass registry (rope_passes.passes, for
    fix_bundle) is the only thing it takes from the passes package."""
    graph = _import_graph()
    offenders = [f"{m} imports {t}" for m, targets in graph.items() if _in(m, "rope_passes.lint")
                 for t in targets if t.startswith("rope_passes.passes.")]
    assert not offenders, "lint must import proofs, not pass modules:\n" + "\n".join(sorted(offenders))
    assert any(t.startswith("rope_passes.proofs") for m, targets in graph.items() if _in(m, "rope_passes.lint")
               for t in targets)


def test_no_pass_imports_another_pass():
    graph = _import_graph()
    passes = _pass_modules()
    assert {"rope_passes.passes.precompute_cos_sin", "rope_passes.passes.narrow_int64",
            "rope_passes.passes.total_seq_on_gpu"} <= passes  # the finder finds passes
    assert "rope_passes.passes._rewrite" not in passes
    offenders = [f"{m} imports {t}" for m in passes for t in graph[m] if t in passes]
    # a private helper that imports a pass module would launder the dependency: those count too
    helpers = [m for m in graph if m.startswith("rope_passes.passes.") and m not in passes]
    offenders += [f"{m} (a helper) imports {t}" for m in helpers for t in graph[m] if t in passes]
    assert not offenders, ("shared facts live in analysis/ or proofs/, not in another pass:\n"
                           + "\n".join(sorted(offenders)))


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: the modules a run of optimize / lint crosses from the command line to the passes: none of them decides the runtime
#: or the preset again; rope_passes.plan (make_plan, lint_plan) does, once
RUN_PATH = ("rope_passes.api", "rope_passes.pipeline", "rope_passes.lint", "rope_passes.passes",
            "rope_passes.cli.optimize_cmd", "rope_passes.cli.lint_cmd", "rope_passes.hf_config")
RESOLVERS = {"default_runtime", "probed_runtime", "detect_installed", "PRESETS", "presets_for", "skipped_for",
             "DEFAULT_PRESET", "ContextVar"}
#: the module of the one resolve (its names are generic: ``resolve`` is also Path.resolve): importing it is a use
CHOOSE = "rope_passes.runtimes.choose"
#: the one default below the plan: a PassContext built by hand (a user's own onnx_ir PassManager, no plan) is for the
#: runtime installed here; our runs always give the plan's
EDGES = {("rope_passes.passes.base", f"{CHOOSE}.resolve")}


def _names_used(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Name) and node.id in RESOLVERS:
            out.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in RESOLVERS:
            out.append((node.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module == CHOOSE:
            out.extend((f"{CHOOSE}.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.extend((alias.name, node.lineno) for alias in node.names if alias.name in RESOLVERS)
    return out


def test_the_run_is_resolved_once_by_the_plan():
    """The preset, the runtime and the options of a run are resolved by rope_passes.plan only; the CLI builds the plan,
    and api, pipeline, lint and the passes read it (PassContext.runtime, LintContext.runtime and .hf_config) instead
    of resolving a default runtime, a preset or a context variable of their own."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} uses {what}"
                 for name, path in _modules().items() if any(_in(name, m) for m in RUN_PATH)
                 for what, line in _names_used(path) if (name, what) not in EDGES]
    assert not offenders, "the run is resolved by rope_passes.plan only:\n" + "\n".join(offenders)
    assert _names_used(PACKAGE / "plan.py")  # the finder finds what it looks for


#: what evaluates a graph: onnxruntime, onnx's reference evaluator, the layer that owns sessions and subgraph runs
EVALUATORS = ("onnxruntime", "onnx.reference", "rope_passes.runtime")


def test_lint_imports_no_module_that_evaluates_a_graph():
    """lint rules judge and word; the evidence (constants evaluated, rotations probed, LongRoPE tables read) comes
    from rope_passes.proofs and rope_passes.analysis, never from a graph evaluation written in lint/."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
                 for name, path in _modules().items() if _in(name, "rope_passes.lint")
                 for imported, line in _imports(name, path) if any(_in(imported, e) for e in EVALUATORS)]
    assert not offenders, "lint must not evaluate graphs itself:\n" + "\n".join(sorted(offenders))
    assert any(_in(i, "rope_passes.runtime") for i, _ in _imports("rope_passes.proofs.rotation",
                                                                 PACKAGE / "proofs" / "rotation.py"))


def test_genai_config_sections_are_read_by_config_only():
    """Every genai_config.json fact is a GenaiConfig property (one rule per fact: a config with only
    search.max_length has the same context length for lint and for annotate-cache-offset); no other module reads its
    raw sections."""
    offenders = []
    for name, path in _modules().items():
        if name == "rope_passes.config":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("_decoder", "_model", "_section", "decoder"):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} reads .{node.attr}")
    assert not offenders, "read genai_config.json through GenaiConfig's properties:\n" + "\n".join(offenders)


#: the top-level sections of genai_config.json: read through GenaiConfig's properties only
GENAI_SECTIONS = ("model", "search")


def _raw_section_reads(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every ``x.get("model"...)`` / ``x.get("search"...)`` call: a genai_config section read from
    the raw dict (a subscript ``x["model"]`` is left alone: regex matches spell their groups so)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in GENAI_SECTIONS:
            found.append((node.lineno, f"reads .get({node.args[0].value!r})"))
    return found


def test_genai_config_raw_sections_are_read_by_config_only(tmp_path):
    """``model.vocab_size``, ``model.pad_token_id``, ``search.past_present_share_buffer``, ``search.max_length`` and
    the rest are GenaiConfig properties: no module but rope_passes/config.py reads the raw dict's sections (the
    checker once read three of them raw, and "capture is on" had two answers)."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} {what}" for name, path in _modules().items()
                 if name != "rope_passes.config" for line, what in _raw_section_reads(path)]
    assert not offenders, "read genai_config.json through GenaiConfig's properties:\n" + "\n".join(offenders)
    # the finder finds what it looks for
    sample = tmp_path / "sample.py"
    sample.write_text('pad = (data or {}).get("model", {}).get("pad_token_id")\nshare = data.get("search")\n')
    assert sorted(line for line, _ in _raw_section_reads(sample)) == [1, 2]
    assert _raw_section_reads(PACKAGE / "config.py")


#: the layers whose failures and findings carry the IR object (review 5, issue 33): a name spelled with a fallback
#: (``x.name or "<model>"``) loses the object and calls an unnamed node the whole model
IR_OBJECT_LAYERS = ("passes", "proofs", "analysis")
NAME_OR = re.compile(r"""\.name\s+or\s+["']""")


def test_failures_carry_the_ir_object_not_a_spelled_name():
    """No ``.name or "..."`` in passes/, proofs/ and analysis/: a failure or a finding takes the node or value itself
    (its place is spelled once, by rope_passes.report.place_of); a key or a record's field reads
    rope_passes.report.name_of."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
                 for layer in IR_OBJECT_LAYERS for path in sorted((PACKAGE / layer).rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if NAME_OR.search(line)]
    assert not offenders, "pass the IR object (report.place_of spells it), or report.name_of:\n" + "\n".join(offenders)
    assert NAME_OR.search('target = node.name or "<model>"') and NAME_OR.search("f\"{n.name or '?'}\"")


#: a run's label: ``original@cpu``, ``rewritten@webgpu+capture``, ``original@webgpu:plugin``
RUN_LABEL = re.compile(r"(?:original|rewritten)@|\+capture\b|:plugin\b")
#: the one home of a run's label (RunKey)
RUN_KEY_HOME = "rope_passes.check.spec"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _label_spellings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in code (docstrings aside; f-strings by their literal parts) that spells a run
    label."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docs = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and RUN_LABEL.search(node.value)]


def test_no_run_label_is_spelled_outside_its_type(tmp_path):
    """A run is a RunKey (graph, ep, runtime, capture) whose str() is its label; no module but its home spells a
    label (``"original@cpu"``, ``f"rewritten@{ep}"``, ``endswith(":plugin")``): review 5 counted 54 such spellings
    in 7 files."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} {text!r}" for name, path in _modules().items()
                 if name != RUN_KEY_HOME for line, text in _label_spellings(path)]
    assert not offenders, "spell runs as RunKey (rope_passes/check/spec.py):\n" + "\n".join(offenders)
    sample = tmp_path / "sample.py"
    sample.write_text('"""original@cpu in a docstring is prose."""\nx = f"rewritten@{ep}"\ny = lab.endswith(":plugin")\n'
                      'z = "original@webgpu+capture"\n')
    assert sorted(line for line, _ in _label_spellings(sample)) == [2, 3, 4]
    assert _label_spellings(PACKAGE / "check" / "spec.py")


MODULE_LINES_MAX = 450  # a module a reader holds at once; the largest today are just under it


def test_no_module_is_longer_than_the_house_allows():
    """Every module of the package stays at or under MODULE_LINES_MAX lines (check/ and its 5k budget: issue 33)."""
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in _modules().values()}
    assert sizes and max(sizes.values()) > MODULE_LINES_MAX // 2  # the walk reads real modules
    over = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p, n in sizes.items() if n > MODULE_LINES_MAX]
    assert not over, "split these modules:\n" + "\n".join(over)
    check_lines = sum(n for p, n in sizes.items() if "check" in p.relative_to(PACKAGE).parts[:1])
    assert check_lines < 5000, check_lines
