"""Shared test fixtures: the read-only corpora beside the checkout (../shared), as CI has them; the two markers.

Markers (declared in pyproject.toml), applied explicitly in the test modules - a module that is wholly of one kind
says so once (``pytestmark``), the others mark each test:

* ``corpus``: reads ../shared/corpus (:data:`GENAI`, :data:`TORCH`) or the generated :data:`FIXTURES`;
* ``webgpu``: creates a WebGPU session, in this process or in a child (``check``, ``run_isolated``, the examples,
  placement probes, ``rope-passes check|demo``), or runs the second WebGPU runtime's interpreter (``.venv-plugin``).
  Such a test fails, never skips, when there is no adapter or no ``.venv-plugin``.

``scripts/test.sh -m "not corpus and not webgpu"`` is the fast inner loop; the full suite is what CI runs.

Explicit rather than inferred (from fixtures or module names): the reader of a test sees what it needs, and a new
test in a marked module is not silently swept into or out of the fast loop. The markers cannot go stale, because
this file checks them while the tests run:

* a test without ``corpus`` that opens or lists a path under the corpora (in this process, or by naming one on a
  child's command line) fails, naming the path;
* a test without ``webgpu`` that creates a WebGPU session in this process fails;
* a run that selects no ``webgpu`` test (the fast loop) hides the WebGPU adapter from itself and its children
  (``VK_ICD_FILENAMES``) and the second WebGPU runtime's interpreter (``ROPE_PASSES_PLUGIN_PYTHON=none``), so an
  unmarked test whose child process needs WebGPU or ``.venv-plugin`` fails there too. ``scripts/test.sh`` sets up
  neither for such a run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ROPE_PASSES_SHARED", REPO.parent / "shared"))
GENAI = SHARED / "corpus" / "genai"
TORCH = SHARED / "corpus" / "torch"
#: graphs generated for this project (committed; tests/fixtures/README.md says how): builder 0.18 families and
#: options beyond the shared corpus, and torch exporters beyond its two
FIXTURES = REPO / "tests" / "fixtures"
#: sweep positions for corpus-wide checks whose subject is another run (the captured decode, a family's output):
#: the exhaustive default sweep (every position 0..context-1, about half a tiny model's check) is the subject of
#: tests/test_check_sweep.py and of test_check.py's self-consistency on one model per family, not of every check
SWEEP = 16
#: the one schedule (``check --schedule``: 3 prompt tokens, then 1 step) of a check whose subject is the verdict or
#: the table that names a break in a deliberately broken model (the default schedules, 33 on a corpus pair and 5/6
#: of its check's time on a software adapter, would only fail alike), or of a corpus model against itself whose
#: default schedules test_check.py's self-consistency runs. Checks of real outputs keep them all
ONE_SCHEDULE = "left rows 3 then 1 pad 0 ids 5.7.9.4"


def genai_models() -> list[str]:
    """Relative folder names of the genai corpus models, e.g. 'current/llama/cpu_fp32' (19 of them)."""
    if not GENAI.is_dir():
        return []
    return sorted(str(p.parent.relative_to(GENAI)) for p in GENAI.glob("*/*/*/model.onnx"))


#: Graphs onnxruntime-webgpu 1.27 cannot load at all (per the corpus README): no session on any EP.
UNLOADABLE = {
    "current/qwen3/webgpu_fp16": "GQA with 16 inputs (q/k-norm fused) is outside 1.27's [7,14]",
    "current/qwen25_vl/cpu_fp32": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen25_vl/webgpu_fp16": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen25_vl/webgpu_int4_graph": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen35/webgpu_fp16_graph": "MRotaryEmbedding is not registered in 1.27",
    "current/qwen35/webgpu_fp32": "MRotaryEmbedding is not registered in 1.27",
}


@pytest.fixture(scope="session")
def genai_corpus() -> Path:
    if not GENAI.is_dir():
        pytest.fail(f"the shared corpus is missing: {GENAI} (CI clones ../shared beside the checkout)")
    return GENAI


# ----------------------------------------------------------------------------------------------------------------
# The marker check (see the module docstring)
# ----------------------------------------------------------------------------------------------------------------
_CORPUS_ROOTS = tuple({str(p) for root in (SHARED / "corpus", FIXTURES) for p in (root.absolute(), root.resolve())})
#: audit events whose first argument is a path that is read or listed
_PATH_EVENTS = {"open", "os.listdir", "os.scandir", "glob.glob", "shutil.copyfile", "shutil.copytree"}
_WEBGPU_EP = "WebGpuExecutionProvider"


class _MarkerCheck:
    def __init__(self) -> None:
        self.item: pytest.Item | None = None  # the running test, while it lacks a marker this checks
        self.corpus = self.webgpu = False  # the running test's markers
        self.problems: list[str] = []
        self.busy = False

    def start(self, item: pytest.Item) -> None:
        self.corpus = item.get_closest_marker("corpus") is not None
        self.webgpu = item.get_closest_marker("webgpu") is not None
        self.item = None if self.corpus and self.webgpu else item

    def stop(self) -> list[str]:
        problems, self.problems, self.item = self.problems, [], None
        return problems

    def _corpus_path(self, arg: object) -> str | None:
        if isinstance(arg, (str, bytes, os.PathLike)):
            path = os.fsdecode(arg)
            full = os.path.abspath(path)
            if any(full == root or full.startswith(root + os.sep) for root in _CORPUS_ROOTS):
                return path
        return None

    def _flag(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)
        pytest.fail(problem, pytrace=False)

    def audit(self, event: str, args: tuple) -> None:
        if self.item is None or self.corpus or self.busy:
            return
        self.busy = True
        try:
            if event in _PATH_EVENTS and args:
                path = self._corpus_path(args[0])
            elif event == "subprocess.Popen":
                _, argv, cwd, _ = args
                words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or ())
                path = next((os.fsdecode(w) for w in [*words, cwd] if isinstance(w, (str, bytes, os.PathLike))
                             and any(root in os.fsdecode(w) for root in _CORPUS_ROOTS)), None)
            else:
                return
        finally:
            self.busy = False
        if path is not None:
            self._flag(f"reads the corpus ({path}) but has no @pytest.mark.corpus")

    def session(self, source: object, providers: object) -> None:
        if self.item is None:
            return
        if not self.webgpu and any(_WEBGPU_EP in (p if isinstance(p, str) else p[0]) for p in providers or ()):
            self._flag("creates a WebGPU session but has no @pytest.mark.webgpu")
        if not self.corpus and (path := self._corpus_path(source)) is not None:
            self._flag(f"reads the corpus ({path}) but has no @pytest.mark.corpus")


_CHECK = _MarkerCheck()
sys.addaudithook(_CHECK.audit)
_session_init = ort.InferenceSession.__init__


def _checked_session_init(self, path_or_bytes, sess_options=None, providers=None, *args, **kwargs):
    _CHECK.session(path_or_bytes, providers)
    _session_init(self, path_or_bytes, sess_options, providers, *args, **kwargs)


ort.InferenceSession.__init__ = _checked_session_init
_ADAPTER_HIDDEN = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After ``-m`` deselection: no WebGPU test selected, so no child process may reach an adapter either."""
    if items and not any(item.get_closest_marker("webgpu") for item in items):
        os.environ["VK_ICD_FILENAMES"] = os.environ["VK_DRIVER_FILES"] = os.devnull
        os.environ["ROPE_PASSES_PLUGIN_PYTHON"] = "none"  # nor the second WebGPU runtime (.venv-plugin)
        config.stash[_ADAPTER_HIDDEN] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _CHECK.start(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        result = yield
    except BaseException as exc:
        _note(item, exc, _CHECK.stop())
        raise
    problems = _CHECK.stop()
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    _CHECK.stop()  # a setup that failed never reached the call
    return (yield)


def _note(item: pytest.Item, exc: BaseException, problems: list[str]) -> None:
    """Explain a failed test's marker problems that its failure may not show (an exception the test swallowed)."""
    lines = [p for p in problems if p not in str(exc)]
    if (item.config.stash.get(_ADAPTER_HIDDEN, False) and item.get_closest_marker("webgpu") is None
            and not problems and ("webgpu" in str(exc).lower() or "adapter" in str(exc).lower())):
        lines.append("this run selected no @pytest.mark.webgpu test, so the WebGPU adapter was hidden "
                     "(VK_ICD_FILENAMES): a test that needs one, even in a child process, must be marked webgpu")
    if lines:
        item.add_report_section("call", "marker check", "\n".join(lines))
