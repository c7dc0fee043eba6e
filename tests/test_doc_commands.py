"""Every command README.md and docs/ show is run here, and what the doc says of its output is checked (issue 32).

Commands are read from the docs themselves (code blocks, and inline code that starts with ``rope-passes`` and has an
argument, a script or a ``python`` call): each must be an entry of :data:`COMMANDS`, so a new command in a doc
without a test fails :func:`test_every_doc_command_is_run_or_said_why_not`. An entry is

* :class:`Run`: the command with the doc's placeholders given real paths (``model_dir`` the embedded tiny decoder,
  ``builds/`` a folder of two, ``dl/`` a transformers.js folder, corpus folders where the doc names a model kind),
  run in this process, its exit code and the doc's claim about it (``check``) asserted;
* :class:`Elsewhere`: run by another test (named: it must exist) - a WebGPU check, a benchmark's smoke run;
* :class:`NotHere`: not runnable in a test, with why (it installs system packages, measures time, needs a tool
  that is not a dependency);
* :class:`Fragment`: a synopsis or part of a command in prose: every ``--option`` (and value with choices) it
  names must be one that command's parser takes (checked for every command, whatever its entry).

The inspect sample of docs/inspect.md is generated from a real run (``python tools/doc_samples.py`` writes it) and
compared here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FIXTURES, GENAI, REPO, TORCH

from rope_passes.cli import COMMANDS as CLI_COMMANDS
from rope_passes.cli import build_parser, main
from rope_passes.demo import build_tiny_decoder

sys.path.insert(0, str(REPO / "tools"))
import doc_samples  # noqa: E402

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_START = r"(?:rope-passes|scripts/[^\s`]|bench/[^\s`]|tools/[^\s`]|python (?:-m |-X |\S+\.py))"


def doc_commands() -> list[tuple[str, str, str]]:
    """(doc, command, the doc's comment on it) for each command shown: code-block lines, and inline code."""
    out = []
    for doc in DOCS:
        text, rel = doc.read_text(encoding="utf-8"), doc.relative_to(REPO).as_posix()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                words = line.split()
                if not re.match(_START, line) or (words[0] == "rope-passes" and (
                        len(words) < 2 or words[1] not in CLI_COMMANDS)):
                    continue  # output that starts like a command (a bench table's title row)
                parts = re.split(r"\s+#\s+", line, maxsplit=1)
                command, comment = parts[0], parts[1] if len(parts) > 1 else ""
                out.append((rel, " ".join(command.split()), comment))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for m in re.finditer(r"`(" + _START + r"[^`]*)`", prose):
            command = " ".join(m.group(1).split())
            if not command.startswith("rope-passes") or len(command.split()) >= 3:
                out.append((rel, command, ""))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the entries
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str
    places: dict[str, Path]

    @property
    def text(self) -> str:
        return " ".join((self.out + self.err).split())


@dataclasses.dataclass(frozen=True)
class Run:
    argv: str  # the command with {placeholders}: tiny, tree, out, tmp, dl, exported, genai, fixtures
    code: int = 0
    check: Callable[[Result], None] | None = None
    corpus: bool = False  # reads the shared corpus or the generated fixtures


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    test: str  # tests/test_x.py::test_name, which runs it


@dataclasses.dataclass(frozen=True)
class NotHere:
    why: str


@dataclasses.dataclass(frozen=True)
class Fragment:
    why: str = "a synopsis or a command's part in prose: its options are checked against the parser"


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _report(r: Result) -> dict:
    return json.loads((r.places["tmp"] / "r.json").read_text())


def _pass(r: Result, name: str) -> dict:
    (entry,) = [p for p in _report(r)["passes"] if p["pass"] == name]
    return entry


def _status(name: str, prefix: str) -> Callable[[Result], None]:
    def check(r: Result) -> None:
        entry = _pass(r, name)
        assert entry["status"].startswith(prefix), entry["status"]
    return check


def _all(*checks: Callable[[Result], None]) -> Callable[[Result], None]:
    def check(r: Result) -> None:
        for c in checks:
            c(r)
    return check


def _says(*words: str) -> Callable[[Result], None]:
    def check(r: Result) -> None:
        for w in words:
            assert " ".join(w.split()) in r.text, (w, r.out, r.err)
    return check


def _inspect_claims(r: Result) -> None:
    assert "fused-gqa" in r.text and "predicted: loads" in r.text
    assert "(installed), predicted" in r.text


def _explain_claims(r: Result) -> None:  # "every match attempt of every pass, with its reason"; nothing written
    from rope_passes.plan import PRESETS

    for name in PRESETS["webgpu"]:
        assert re.search(rf"^{re.escape(name)}: ", r.out, flags=re.M), name
    assert "dry run: nothing written" in r.out
    assert _digest(r.places["tiny"]) == r.places["tiny_digest"]  # type: ignore[comparison-overlap]


def _tree_claims(r: Result) -> None:  # "a folder of model folders, one line each"
    assert re.search(r"^\[1/2\] a: rewritten", r.err, flags=re.M) and re.search(r"^\[2/2\] b: rewritten", r.err,
                                                                                 flags=re.M), r.err
    assert "2 models: 2 rewritten, 0 unchanged, 0 failed" in r.err


def _in_place_claims(r: Result) -> None:  # "rewrites model.onnx, genai_config.json ...; the summary lists them"
    before, after = r.places["tiny_digest"], _digest(r.places["tiny"])
    changed = sorted(n for n in after if before.get(n) != after[n])  # type: ignore[union-attr]
    assert changed == ["genai_config.json", "model.onnx"], changed
    assert "files: model.onnx, genai_config.json differ from the input" in r.out, r.out


def _link_claims(r: Result) -> None:  # --weights link: a hard link to the input's weights
    a, b = r.places["tiny"] / "model.onnx.data", r.places["out"] / "model.onnx.data"
    assert a.stat().st_ino == b.stat().st_ino and "(weights: link)" in r.out


def _web_claims(r: Result) -> None:
    assert "output for onnxruntime-web" in r.text
    import onnx

    meta = {p.key: p.value for p in onnx.load(r.places["out"] / "model.onnx", load_external_data=False).metadata_props}
    assert meta["rope_passes.runtime"] == "onnxruntime-web"


def _dl_claims(r: Result) -> None:  # "web/onnx/model.onnx rewritten, everything else carried"
    before, after = _digest(r.places["dl"]), _digest(r.places["out"])
    assert set(before) == set(after)
    assert [n for n in after if before[n] != after[n]] == ["onnx/model.onnx"], after


def _github_claims(r: Result) -> None:
    lines = [ln for ln in r.out.splitlines() if ln]
    assert lines and all(re.match(r"::(error|warning|notice) file=", ln) for ln in lines), r.out
    assert {ln.split("file=")[1].split(",")[0] for ln in lines} == {str(r.places["tree"] / s / "model.onnx")
                                                                    for s in ("a", "b")}


def _passes_claims(r: Result) -> None:  # "the passes and the presets, in order"
    from rope_passes.passes import ALL_PASSES
    from rope_passes.plan import presets_for

    for name in ALL_PASSES:
        assert name in r.out, name
    for preset, names in presets_for().items():
        assert f"--preset {preset}: " + " → ".join(names) in r.out, preset


def _sarif_claims(r: Result) -> None:
    sarif = json.loads((r.places["tmp"] / "rope.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]


def _exporter_claims(r: Result) -> None:
    entry = _pass(r, "precompute-cos-sin")
    assert entry["rewritten"] > 0, entry["status"]


def _lint_dl_claims(r: Result) -> None:
    assert "RP501" in r.out, r.out


def _lint_fix_dl_claims(r: Result) -> None:  # "repair it in place (metadata only)"
    import onnx

    before = onnx.load(str(TORCH / "tf5" / "dynamo" / "llama" / "decode.onnx"))
    after = onnx.load(str(r.places["dl"] / "onnx" / "model.onnx"))
    assert before.graph.node == after.graph.node and before.graph.initializer == after.graph.initializer
    assert before.graph.input != after.graph.input  # the batch axis' name: metadata


def _no_rp501(r: Result) -> None:
    assert "RP501" not in r.out, r.out


def _skipped_unfuse(r: Result) -> None:  # "left fused (skipped: not needed)"
    assert "unfuse-gqa-qk-norm" in _report(r)["skipped"]


def _fold_refused_lower_applies(r: Result) -> None:
    assert _pass(r, "fold-text-mrope")["rewritten"] == 0 and _pass(r, "lower-mrope")["rewritten"] > 0


def _capture_ready(r: Result) -> None:
    assert _report(r)["capture"]["state"] == "ready", _report(r)["capture"]


def _lint_tiny(r: Result) -> None:
    assert "RP201" in r.out and "3 problems in 1 model" in r.out


_R = "--report {tmp}/r.json"
#: normalized command (as :func:`doc_commands` reads it) -> how it is covered
COMMANDS: dict[str, Run | Elsewhere | NotHere | Fragment] = {
    # README.md
    "scripts/demo.sh": NotHere("sets up a fresh machine (venv, package, Mesa's Vulkan driver as root) before the "
                               "demo; the demo itself: tests/test_examples.py::test_demo_runs_and_leaves_nothing_behind"),
    "scripts/test.sh": NotHere("sets up every runtime and runs the whole suite: it is what CI runs"),
    'scripts/test.sh -m "not corpus and not webgpu"': NotHere("runs the suite itself (the fast loop)"),
    "scripts/setup.sh": Elsewhere("tests/test_setup_scripts.py::test_an_up_to_date_venv_is_not_reinstalled"),
    "rope-passes inspect model_dir/": Run("inspect {tiny}", check=_inspect_claims),
    "rope-passes optimize model_dir/ -o out_dir/ --preset webgpu-graph [--text-only] [--report r.json]":
        Run("optimize {tiny} -o {out} --preset webgpu-graph --text-only --report {tmp}/r.json",
            check=_all(_capture_ready, _says("files: model.onnx, genai_config.json differ from the input"))),
    "rope-passes optimize model_dir/ --dry-run --explain": Run("optimize {tiny} --dry-run --explain",
                                                               check=_explain_claims),
    "rope-passes check model_dir/ out_dir/ --graph-capture":
        Elsewhere("tests/test_examples.py::test_optimize_and_check_example_on_tiny_model"),
    "rope-passes optimize decode.onnx -o out.onnx --preset exporter --max-positions 4096":
        Run("optimize {fixtures}/torch/tf5/hf_onnx/llama/decode.onnx -o {tmp}/out.onnx --preset exporter "
            "--max-positions 4096 " + _R, check=_exporter_claims, corpus=True),
    "rope-passes optimize builds/ -o out/ --preset webgpu-graph --text-only":
        Run("optimize {tree} -o {out} --preset webgpu-graph --text-only", check=_tree_claims),
    "rope-passes optimize model_dir/ --in-place --preset webgpu-graph":
        Run("optimize {tiny} --in-place --preset webgpu-graph", check=_in_place_claims),
    "rope-passes optimize model_dir/ -o out_dir/ --weights link": Run("optimize {tiny} -o {out} --weights link",
                                                                      check=_link_claims),
    "rope-passes optimize model_dir/ -o web_dir/ --preset webgpu-graph --runtime onnxruntime-web":
        Run("optimize {tiny} -o {out} --preset webgpu-graph --runtime onnxruntime-web", check=_web_claims),
    "rope-passes optimize dl/ -o out/ --preset exporter": Run("optimize {dl} -o {out} --preset exporter",
                                                              check=_dl_claims, corpus=True),
    "rope-passes lint models/ --format github": Run("lint {tree} --format github", code=1, check=_github_claims),
    "rope-passes passes": Run("passes", check=_passes_claims),
    # docs/architecture.md, docs/graph-capture.md, docs/runtimes.md: the probes
    "tools/probe_runtime.py": NotHere("probes an installed runtime for minutes and writes its table "
                                      "(rope_passes/runtime_tables); tests/test_targets.py reads the tables"),
    "tools/probe_web_runtime.py": NotHere("probes the browser for minutes and writes its table"),
    "tools/probe_web_runtime.py --host onnxruntime-node": NotHere("probes onnxruntime-node and writes its table"),
    "tools/js_runtime_table.py": Elsewhere("tests/test_js_runtimes.py::test_the_js_runtime_table_of_the_docs_is_the_probes"),
    # docs/checker.md
    "rope-passes check ORIGINAL REWRITTEN [--ep webgpu|cpu] [--prefill N] [--steps N] [--graph-capture]": Fragment(),
    "scripts/setup-plugin-runtime.sh": NotHere("installs the second runtime (pip, minutes): scripts/test.sh runs it"),
    "python -m rope_passes.check.runner": NotHere("the child process check starts itself, with its own arguments"),
    # docs/exporter.md
    "rope-passes optimize exported_dir -o out_dir --preset exporter":
        Run("optimize {exported} -o {out} --preset exporter " + _R, check=_exporter_claims, corpus=True),
    "rope-passes optimize decode.onnx -o out.onnx --preset exporter --hf-config path/to/config.json":
        Run("optimize {exported}/model.onnx -o {tmp}/out.onnx --preset exporter --hf-config {exported}/config.json "
            + _R, check=_exporter_claims, corpus=True),
    "rope-passes lint exported_dir": Elsewhere("tests/test_exporter_folders.py::test_lint_names_the_cause"),
    "python examples/exporter_then_ort_fusions.py [EXPORT_DIR] [--steps N]":
        Elsewhere("tests/test_examples.py::test_onnx_ir_pass_manager_example_gives_optimize_bytes"),
    "rope-passes optimize FOLDER -o OUT --preset exporter": Fragment(),
    # docs/graph-capture.md, docs/lint.md
    "python -m rope_passes.runtime.placement_probe model.onnx --probe":
        Elsewhere("tests/test_placement.py::test_static_prediction_equals_probe"),
    "python -m rope_passes.runtime.placement_probe model.onnx --capture 0":
        Elsewhere("tests/test_placement.py::test_static_prediction_equals_probe"),
    "rope-passes check --graph-capture": Fragment(),
    # docs/inspect.md (the sample: test_inspect_sample_is_a_real_run)
    "rope-passes inspect MODEL [MODEL ...] [--json]": Fragment(),
    "python tools/doc_samples.py": Elsewhere("tests/test_doc_commands.py::test_inspect_sample_is_a_real_run"),
    "rope-passes inspect current/phi3_mini_128k/cpu_fp32 legacy/qwen35/cpu_fp32_text":
        Elsewhere("tests/test_doc_commands.py::test_inspect_sample_is_a_real_run"),
    # docs/lint.md
    "rope-passes lint MODEL... [--format text|json|github|sarif] [--fix [--preset P] [--text-only]] [--select CODES] "
    "[--ignore CODES] [--fail-on error|warning|note]": Fragment(),
    "rope-passes lint --format sarif -o rope.sarif models/*.onnx":
        Run("lint --format sarif -o {tmp}/rope.sarif {tiny}/model.onnx", code=1, check=_sarif_claims),
    "rope-passes optimize --text-only": Fragment(),
    "rope-passes check ORIGINAL REWRITTEN --graph-capture": Fragment(),
    "rope-passes optimize --preset webgpu-graph": Fragment(),
    # docs/passes/*.md
    "rope-passes optimize model_dir -o out_dir":  # "folds graphs that prove text-only positions"
        Run("optimize {genai}/legacy/qwen35/cpu_fp32_text -o {out} " + _R,
            check=_status("fold-text-mrope", "rewritten"), corpus=True),
    "rope-passes optimize model_dir -o out_dir --text-only":  # "also folds VL graphs with 3D position_ids inputs"
        Run("optimize {genai}/legacy/qwen25_vl/cpu_fp32 -o {out} --text-only " + _R,
            check=_status("fold-text-mrope", "rewritten"), corpus=True),
    "rope-passes optimize model_dir -o out_dir --passes fold-text-mrope --text-only":
        Run("optimize {genai}/legacy/qwen25_vl/cpu_fp32 -o {out} --passes fold-text-mrope --text-only " + _R,
            check=_status("fold-text-mrope", "rewritten"), corpus=True),
    "bench/realsize.py": Elsewhere("tests/test_bench_smoke.py::test_every_model_builds_at_real_width"),
    "rope-passes optimize DIR -o OUT --preset webgpu-graph --text-only":
        Run("optimize {genai}/legacy/qwen25_vl/cpu_fp32 -o {out} --preset webgpu-graph --text-only " + _R,
            check=_all(_status("fold-text-mrope", "rewritten"), _capture_ready), corpus=True),
    "rope-passes optimize current/phi3_mini_128k/webgpu_fp32 -o out --preset webgpu-graph":
        Run("optimize {genai}/current/phi3_mini_128k/webgpu_fp32 -o {out} --preset webgpu-graph " + _R,
            check=_all(_status("longrope-concat", "rewritten"), _capture_ready), corpus=True),
    "rope-passes optimize qwen25_vl_dir -o out_dir":  # "fold refused (3D positions), lower-mrope applies"
        Run("optimize {genai}/current/qwen25_vl/cpu_fp32 -o {out} " + _R, check=_fold_refused_lower_applies,
            corpus=True),
    "rope-passes optimize qwen25_vl_dir -o out_dir --passes lower-mrope":
        Run("optimize {genai}/current/qwen25_vl/cpu_fp32 -o {out} --passes lower-mrope " + _R,
            check=_status("lower-mrope", "rewritten"), corpus=True),
    # "runs it after RP501" (and the other fixes lint finds; some warnings stay: exit 1)
    "rope-passes lint FOLDER --fix": Run("lint {dl} --fix", code=1, check=_no_rp501, corpus=True),
    "rope-passes lint FOLDER --fix --select RP501": Run("lint {dl} --fix --select RP501",
                                                        check=_all(_lint_fix_dl_claims, _no_rp501), corpus=True),
    "rope-passes optimize MODEL -o OUT --passes name-batch-dim":
        Run("optimize {dl} -o {out} --passes name-batch-dim " + _R,
            check=_status("name-batch-dim", "updated: dim 'batch' renamed 'batch_size'"), corpus=True),
    "rope-passes optimize model_dir -o out_dir --preset webgpu-graph":
        Run("optimize {tiny} -o {out} --preset webgpu-graph " + _R,
            check=_all(_status("total-seq-on-gpu", "rewritten"), _capture_ready)),
    "rope-passes optimize model_dir -o out_dir --passes total-seq-on-gpu,narrow-int64,cleanup":
        Run("optimize {tiny} -o {out} --passes total-seq-on-gpu,narrow-int64,cleanup " + _R,
            check=_status("total-seq-on-gpu", "rewritten")),
    "rope-passes optimize model_dir -o out_dir --passes precompute-cos-sin,cleanup":
        Run("optimize {exported} -o {out} --passes precompute-cos-sin,cleanup " + _R, check=_exporter_claims,
            corpus=True),
    "rope-passes lint --fix --hf-config PATH": Fragment(),
    "rope-passes optimize model_dir -o out_dir --passes total-seq-on-gpu,cleanup":
        Run("optimize {tiny} -o {out} --passes total-seq-on-gpu,cleanup " + _R,
            check=_status("total-seq-on-gpu", "rewritten")),
    "rope-passes optimize qwen3_dir -o out_dir --runtime onnxruntime-webgpu":  # "unfused: loads on 1.27"
        Run("optimize {genai}/current/qwen3/webgpu_fp16 -o {out} --runtime onnxruntime-webgpu " + _R,
            check=_all(_status("unfuse-gqa-qk-norm", "rewritten"), lambda r: _no_remaining(r, "RP002")),
            corpus=True),
    "rope-passes optimize qwen3_dir -o out_dir --runtime onnxruntime-ep-webgpu":
        Run("optimize {genai}/current/qwen3/webgpu_fp16 -o {out} --runtime onnxruntime-ep-webgpu " + _R,
            check=_skipped_unfuse, corpus=True),
    "rope-passes optimize qwen3_dir -o out_dir --passes unfuse-gqa-qk-norm,cleanup":
        Run("optimize {genai}/current/qwen3/webgpu_fp16 -o {out} --passes unfuse-gqa-qk-norm,cleanup " + _R,
            check=_status("unfuse-gqa-qk-norm", "rewritten"), corpus=True),
    # docs/performance.md: timings belong to bench/, not tests
    "bench/run_all --json out.json": NotHere("the real-size benchmark (12 min here); its CI-sized run: "
                                             "tests/test_bench_smoke.py::test_run_all_prints_every_row"),
    "bench/run_all --startup-only": NotHere("measures start-up times (a benchmark)"),
    "bench/run_all": NotHere("the benchmark"),
    "bench/run_all --only qwen25vl-3b-legacy --quick --quick-layers 36 --dense-model none --no-slope --no-decode "
    "--dense-limit 0": NotHere("a benchmark run (minutes)"),
    "bench/run_all --only qwen25vl-3b-legacy,phi3-mini-128k-graph --repeat 3 --dense-model none --no-slope "
    "--no-decode --commands floor,opt-link --no-cli-startup": NotHere("a benchmark run (minutes)"),
    "bench/gpu.sh": NotHere("the real-size GPU evidence: a GPU machine, with the carry bench/gpu_carry.sh makes"),
    "bench/gpu_carry.sh": NotHere("downloads the wheels and fixtures a GPU machine without network needs"),
    "bench/gpu.sh --tiny": Elsewhere("tests/test_gpu_evidence.py::test_gpu_script_runs_at_tiny_size_and_writes_its_tables"),
    "bench/gpu.sh --tiny --out out/gpu":
        Elsewhere("tests/test_gpu_evidence.py::test_gpu_script_runs_at_tiny_size_and_writes_its_tables"),
    "bench/gpu_evidence.py": Elsewhere("tests/test_gpu_evidence.py::test_gpu_script_runs_at_tiny_size_and_writes_its_tables"),
    "python bench/gpu_evidence.py --render docs/gpu-evidence-tiny.json":
        Elsewhere("tests/test_gpu_evidence.py::test_performance_doc_shows_the_scripts_tables"),
    "bench/genai_loop.py": Elsewhere("tests/test_genai_generate.py::test_unedited_output_generates_with_capture_like_the_original"),
    "rope-passes lint tiny": Run("lint {tiny}", code=1, check=_lint_tiny),
    "rope-passes inspect tiny": Run("inspect {tiny}", check=_inspect_claims),
    'python -X importtime -c "import onnx_ir"': NotHere("measures import time (a benchmark's tool)"),
    # docs/producer-bugs.md: mobius is not a dependency
    "python tests/fixtures/tools/make_mobius.py /tmp/mob --only cohere,ernie4_5":
        NotHere("needs mobius (not a dependency; tests/fixtures/README.md says how the fixtures were made)"),
    "rope-passes lint /tmp/mob/cohere/webgpu_f32 --hf-config /tmp/mob/cohere/webgpu_f32/hf_config.json":
        NotHere("lints make_mobius.py's output (mobius is not a dependency)"),
    "python -m mobius build --config HF_DIR OUT --ep webgpu --runtime ort-genai --dtype f32":
        NotHere("mobius is not a dependency"),
    "rope-passes lint MODEL_DIR --hf-config MODEL_DIR/hf_config.json":
        Elsewhere("tests/test_mobius.py::test_original_matches_hugging_face"),
    # docs/runtimes.md
    "scripts/setup.sh --with-plugin-runtime": NotHere("installs the second runtime (pip, minutes)"),
    "rope-passes lint dl/": Run("lint {dl}", code=1, check=_lint_dl_claims, corpus=True),
    "rope-passes lint dl/ --fix --select RP501": Run("lint {dl} --fix --select RP501", check=_lint_fix_dl_claims,
                                                     corpus=True),
    "rope-passes optimize dl/ -o web/ --preset exporter": Run("optimize {dl} -o {out} --preset exporter",
                                                              check=_dl_claims, corpus=True),
    "rope-passes check dl/ web/": Elsewhere(
        "tests/test_transformers_js.py::test_transformers_js_generates_the_same_tokens_from_the_optimized_folder"),
    "rope-passes optimize dl/onnx/model_q4f16.onnx -o web/onnx/model_q4f16.onnx --preset exporter":
        Run("optimize {dl}/onnx/model_q4f16.onnx -o {out}/onnx/model_q4f16.onnx --preset exporter " + _R,
            check=_exporter_claims, corpus=True),
    "rope-passes check ORIG OUT --runtime web": Elsewhere(
        "tests/test_web_runtime.py::test_check_in_the_browser_is_equivalent_with_capture"),
    "bench/web_decode.py --longrope": NotHere("times the web decode loop on Dawn for Node (a benchmark: timings "
                                              "belong in bench/); the loop itself: tests/test_web_decode_loop.py"),
    "scripts/setup-web-runtime.sh": NotHere("installs chromium, Node packages and Dawn (downloads, minutes)"),
    # docs/transformers-js-batch-dim.md
    "rope-passes lint FOLDER": Run("lint {dl}", code=1, check=_lint_dl_claims, corpus=True),
}


def _no_remaining(r: Result, code: str) -> None:
    assert code not in {x["code"] for x in _report(r)["remaining"]}, _report(r)["remaining"]


def test_every_doc_command_is_run_or_said_why_not():
    found = doc_commands()
    assert len(found) > 60, "the extractor lost the docs' commands"
    missing = sorted({(doc, command) for doc, command, _ in found if command not in COMMANDS})
    assert not missing, f"doc commands without an entry in COMMANDS: {missing}"
    unused = sorted(set(COMMANDS) - {command for _, command, _ in found})
    assert not unused, f"COMMANDS entries no doc shows any more: {unused}"


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    return (REPO / path).is_file() and re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(),
                                                 flags=re.M) is not None


def test_elsewhere_names_a_real_test():
    bad = [e.test for e in COMMANDS.values() if isinstance(e, Elsewhere) and not _test_exists(e.test)]
    assert not bad, bad


def _subparsers():
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if c.startswith("rope-passes ")))
def test_every_option_a_doc_names_is_the_command_s(command):
    """Each ``--option`` a doc shows (synopses included) is one the command takes, with a value it accepts."""
    words = command.replace("[", " ").replace("]", " ").split()
    parser = _subparsers()[words[1]]
    options = {s: a for a in parser._actions for s in a.option_strings}
    for i, word in enumerate(words):
        if not word.startswith("-") or word in ("-", "--"):
            continue
        assert word in options, (command, word)
        action = options[word]
        if action.choices and i + 1 < len(words):
            values = words[i + 1].split("|")
            assert set(values) <= set(action.choices) or values[0].isupper() or len(values[0]) == 1, (word, values)


# ---------------------------------------------------------------------------------------------------------------
# running them
# ---------------------------------------------------------------------------------------------------------------
_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 256, "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("doc") / "tiny")


def _places(tmp_path: Path, tiny_src: Path, corpus: bool) -> dict:
    tiny = shutil.copytree(tiny_src, tmp_path / "tiny")
    tree = tmp_path / "tree"
    for sub in ("a", "b"):
        shutil.copytree(tiny_src, tree / sub)
    places = {"tiny": tiny, "tree": tree, "out": tmp_path / "out", "tmp": tmp_path, "genai": GENAI,
              "fixtures": FIXTURES, "tiny_digest": _digest(tiny)}
    if corpus:
        dl = tmp_path / "dl"  # a transformers.js folder as the exporter left it (batch axis 'batch': RP501)
        (dl / "onnx").mkdir(parents=True)
        graph = TORCH / "tf5" / "dynamo" / "llama" / "decode.onnx"
        shutil.copyfile(graph, dl / "onnx" / "model.onnx")
        shutil.copyfile(graph, dl / "onnx" / "model_q4f16.onnx")
        (dl / "config.json").write_text(json.dumps(_CONFIG, indent=1))
        exported = tmp_path / "exported"  # an exporter folder: the graph and its config.json
        exported.mkdir()
        shutil.copyfile(FIXTURES / "torch" / "tf5" / "hf_onnx" / "llama" / "decode.onnx", exported / "model.onnx")
        shutil.copyfile(FIXTURES / "hf_rope" / "tf5" / "llama" / "config.json", exported / "config.json")
        places.update(dl=dl, exported=exported)
    return places


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _run(command: str, tmp_path: Path, tiny_src: Path) -> None:
    entry = COMMANDS[command]
    assert isinstance(entry, Run)
    places = _places(tmp_path, tiny_src, entry.corpus)
    argv = [w.format(**places) for w in shlex.split(entry.argv)]
    code, out, err = _cli(argv)
    assert code == entry.code, (command, argv, code, out[-3000:], err[-3000:])
    if entry.check is not None:
        entry.check(Result(code, out, err, places))


_FAST = sorted(c for c, e in COMMANDS.items() if isinstance(e, Run) and not e.corpus)
_CORPUS = sorted(c for c, e in COMMANDS.items() if isinstance(e, Run) and e.corpus)


@pytest.mark.parametrize("command", _FAST)
def test_doc_command(command, tmp_path, tiny_src):
    _run(command, tmp_path, tiny_src)


@pytest.mark.corpus
@pytest.mark.parametrize("command", _CORPUS)
def test_doc_command_on_the_corpus(command, tmp_path, tiny_src):
    _run(command, tmp_path, tiny_src)


@pytest.mark.corpus
def test_inspect_sample_is_a_real_run():
    """docs/inspect.md's sample is what ``rope-passes inspect`` prints for those two corpus folders (regenerate it
    with ``python tools/doc_samples.py``)."""
    for doc, block, produced in doc_samples.samples(GENAI):
        assert block == produced, f"{doc}: the sample is not a real run's output; run python tools/doc_samples.py"


def test_the_sample_tool_runs():
    done = subprocess.run([sys.executable, str(REPO / "tools" / "doc_samples.py"), "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------------------------
# the Python blocks
# ---------------------------------------------------------------------------------------------------------------
#: doc -> (names the block uses -> the paths given them here, what its prints must say) or why it is not run here
PYTHON_BLOCKS: dict[str, tuple[dict[str, str], tuple[str, ...]] | str] = {
    "README.md": ({'"qwen_dir"': "{genai}/legacy/qwen25_vl/cpu_fp32", '"qwen_webgpu"': "{tmp}/qwen_webgpu",
                   '"model.onnx"': "{tiny}/model.onnx"},
                  ("fold-text-mrope rewritten", "total-seq-on-gpu rewritten", "not matched")),
    "docs/passes/precompute-cos-sin.md": ({'"decode.onnx"': "{fixtures}/torch/tf5/hf_onnx/llama/decode.onnx",
                                           '"decode.precomputed.onnx"': "{tmp}/decode.precomputed.onnx"},
                                          ("rewritten 2",)),
    "docs/checker.md": "creates WebGPU sessions: the API it shows is tests/test_check.py's; its names are real "
                       "(tests/test_docs.py)",
    "docs/graph-capture.md": "probe_placement creates a WebGPU session (tests/test_placement.py); its names are real "
                             "(tests/test_docs.py)",
    "docs/transformers-js-batch-dim.md": "the repro written for transformers.js's maintainers (make_repro.py, run "
                                         "with transformers.js under Node by hand); the failure it shows runs in "
                                         "tests/test_transformers_js.py on the corpus graph",
}


def _python_blocks() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for doc in DOCS:
        for block in re.findall(r"^```python\n(.*?)^```", doc.read_text(encoding="utf-8"), flags=re.S | re.M):
            rel = doc.relative_to(REPO).as_posix()
            assert rel not in blocks, f"{rel}: more than one Python block: give each an entry"
            blocks[rel] = block
    return blocks


def test_every_python_block_is_run_or_said_why_not():
    assert set(_python_blocks()) == set(PYTHON_BLOCKS)


@pytest.mark.corpus
@pytest.mark.parametrize("doc", sorted(d for d, e in PYTHON_BLOCKS.items() if not isinstance(e, str)))
def test_python_block_runs_and_prints_what_it_says(doc, tmp_path, tiny_src):
    names, said = PYTHON_BLOCKS[doc]  # type: ignore[misc]
    places = _places(tmp_path, tiny_src, corpus=True)
    code = _python_blocks()[doc]
    for name, path in names.items():
        assert name in code, (doc, name)
        code = code.replace(name, repr(path.format(**places)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, doc, "exec"), {"__name__": "__doc_block__"})  # noqa: S102 - the doc's own code
    for words in said:
        assert words in out.getvalue(), (doc, words, out.getvalue())


# ---------------------------------------------------------------------------------------------------------------
# tables of the docs that are data of the code
# ---------------------------------------------------------------------------------------------------------------


def test_lint_md_rule_table_is_the_rules():
    """docs/lint.md's table: one row per rule, its name, severity, fix (with the option it needs) and summary as the
    rule says them; RP221/RP222's fix is lint --fix's config step (rope_passes.lint.CONFIG_FIXES)."""
    from rope_passes.lint import CONFIG_FIXES, RULES

    rows = {m[0]: m[1:] for m in re.findall(r"^\| (RP\d+) \| `([^`]+)` \| (\w+) \| (.*?) \| (.*) \|$",
                                           (REPO / "docs" / "lint.md").read_text(encoding="utf-8"), flags=re.M)}
    assert set(rows) == set(RULES)
    for code, rule in RULES.items():
        name, severity, fix, what = rows[code]
        assert (name, severity, what) == (rule.name, str(rule.severity), rule.summary), code
        if code in CONFIG_FIXES:
            assert fix.startswith("`--fix`: enableGraphCapture"), (code, fix)
        else:
            assert fix == (f"`{rule.fix} {rule.fix_flag}`".replace(" `", "`") if rule.fix else "—"), (code, fix)
