"""One decode run of one graph on one execution provider, in this process or isolated in a subprocess.

A run is described by a :class:`RunSpec` (plain data, JSON-serialisable) so the same description runs in-process or in
``python -m rope_passes.check.runner SPEC.json OUT_DIR``. Isolation matters: onnxruntime-webgpu has been seen to
segfault on some graphs (and under graph capture); in a subprocess a crash is a reported result
(``status="crashed"``, with the signal), not the end of the checker.

The worker prints ``STEP k`` after each call (``SWEEP k`` after each sweep position) so the parent can drive a
progress bar, writes every output of every step to ``step<k>.npz`` (of every swept position to ``sweep<p>.npz``) and
the outcome to ``result.json``. Under another interpreter (``python=``: the other WebGPU runtime's, from
:func:`rope_passes.runtime.interpreters.python_for`) the worker runs with this repository on its ``PYTHONPATH``
(:func:`rope_passes.runtime.interpreters.child_env`). Every session, on either runtime, comes from
:func:`rope_passes.runtime.sessions.create_session` (the plugin EP registered once per process, no silent CPU
fallback).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.check.decode import PRESENT_PREFIX, DecoderSpec, random_feeds, run_decode, token_ids
from rope_passes.errors import UsageError

#: status values of a run
OK, LOAD_FAILED, RUN_FAILED, CRASHED, TIMED_OUT = "ok", "load-failed", "run-failed", "crashed", "timed-out"
#: the checker could not drive the graph (a dimension it cannot size, not a decoder): no run happened, nothing about
#: the graph was learnt (the verdict is "could not run", exit 2, never "not equivalent")
NOT_RUN = "could-not-run"
#: how the reason of a load-failed run starts when its interpreter could not even be started
NOT_STARTED = "cannot start"


@dataclasses.dataclass
class RunSpec:
    """What to run: a model on an EP, with a decode schedule (prefill + single-token steps)."""

    label: str  # e.g. "original@cpu"
    model: str  # path of the .onnx file
    ep: str  # "cpu" | "webgpu"
    prefill: int
    steps: int
    genai_config: dict | None = None
    webgpu_options: dict[str, str] = dataclasses.field(default_factory=dict)
    graph_capture: bool = False  # drive the session with fixed WebGPU buffers (see capture.py)
    max_length: int | None = None  # static KV length under capture
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    embedding: str | None = None  # .npy embedding table for inputs_embeds graphs
    seed: int = 0
    sweep: list[int] = dataclasses.field(default_factory=list)  # positions of single steps after a random past
    schedules: list[dict] = dataclasses.field(default_factory=list)  # .schedules.Schedule.spec() of each, in order
    schedules_twice: int = 0  # a reference: .schedule_runs.run_reference (twice, rows alone); ids below this vocab
    vocab: int | None = None  # the decode's and the sweep's ids below this (.contract.vocabulary)


@dataclasses.dataclass
class RunResult:
    label: str
    status: str
    reason: str = ""
    steps: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    providers: list[str] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    failed_step: int | None = None  # run-failed: the step whose call raised (the steps before it are kept)
    runtime: str = ""  # "onnxruntime <version>" that ran it
    sweep: dict[int, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)  # position -> outputs
    sweep_errors: dict[int, str] = dataclasses.field(default_factory=dict)  # position -> why its call raised
    schedules: dict[str, list[dict[str, np.ndarray]]] = dataclasses.field(default_factory=dict)  # name -> calls
    schedule_errors: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why the next call raised

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "status": self.status, "reason": self.reason, "providers": self.providers,
                "steps_run": len(self.steps), "failed_step": self.failed_step, "runtime": self.runtime,
                "wall_s": round(self.wall_s, 3), "notes": self.notes, "sweep_positions": sorted(self.sweep),
                "sweep_errors": {str(p): e for p, e in sorted(self.sweep_errors.items())},
                "schedules_run": {n: len(c) for n, c in self.schedules.items()},
                "schedule_errors": dict(self.schedule_errors)}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:600]


def execute_run(spec: RunSpec, on_step: Callable[[int], None] | None = None, capture_log: bool = False,
                on_sweep: Callable[[int], None] | None = None,
                on_schedule: Callable[[int], None] | None = None) -> RunResult:
    """Run ``spec`` in this process; every failure becomes a status with a one-line reason.

    ``capture_log``: log the capture session at info level (the worker does, so the parent can count replays).
    """
    from rope_passes.runtime.sessions import create_session, runtime_label

    start = time.perf_counter()
    result = RunResult(spec.label, OK, runtime=runtime_label())
    table = np.load(spec.embedding) if spec.embedding else None
    dspec = None
    try:
        if spec.graph_capture:
            from rope_passes.check.capture import CaptureDriver

            driver = CaptureDriver(spec, table, log_severity=1 if capture_log else 3)
            result.providers = driver.providers
        else:
            sess = create_session(spec.model, spec.ep, webgpu_options=spec.webgpu_options)
            result.providers = list(sess.get_providers())
    except UsageError as exc:  # the checker cannot drive this graph: not a property of the graph
        result.status, result.reason = NOT_RUN, _one_line(exc)
        result.wall_s = time.perf_counter() - start
        return result
    except Exception as exc:  # noqa: BLE001 - a model that does not load is a result
        result.status, result.reason = LOAD_FAILED, _one_line(exc)
        result.wall_s = time.perf_counter() - start
        return result
    try:
        if spec.graph_capture:
            driver.run(on_step=on_step, results=result.steps)
            result.notes.extend(driver.notes)
        else:
            dspec = DecoderSpec.from_session(sess, spec.genai_config, dims=dict(spec.dims), embedding_table=table,
                                             vocab=spec.vocab)
            if dspec.is_decoder:
                tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
                run_decode(sess, dspec, tokens, spec.prefill, spec.steps, on_step=on_step, results=result.steps)
            else:
                feeds = random_feeds(dspec, spec.seed)
                result.steps = [dict(zip(dspec.outputs, sess.run(dspec.outputs, feeds)))]
                if on_step:
                    on_step(0)
    except UsageError as exc:  # e.g. a capture output dimension the checker cannot size: no run happened
        result.status, result.reason = NOT_RUN, _one_line(exc)
    except Exception as exc:  # noqa: BLE001
        result.status, result.reason = RUN_FAILED, _one_line(exc)
        result.failed_step = len(result.steps)
    if spec.schedules and dspec is not None and dspec.is_decoder and not spec.graph_capture:
        from rope_passes.check.schedule_runs import run_reference
        from rope_passes.check.schedules import from_spec

        for k, data in enumerate(spec.schedules):
            try:
                run_reference(sess, dspec, from_spec(data), spec.schedules_twice or None, result.schedules)
            except Exception as exc:  # noqa: BLE001 - a call that raises is a result; the calls before it are kept
                result.schedule_errors[data["name"]] = _one_line(exc)
            if on_schedule is not None:
                on_schedule(k)
    if spec.sweep and dspec is not None and dspec.is_decoder and not spec.graph_capture:
        from rope_passes.check.sweep import run_sweep

        for k, position in enumerate(spec.sweep):
            run_sweep(sess, dspec, [position], spec.seed, result.sweep, result.sweep_errors)
            # the past in present.* is the random input, the new token's row is what the graph computed: keep that
            # (a long table's last positions would otherwise hold GBs of copied past per run)
            for name, value in result.sweep.get(position, {}).items():
                if name.startswith(PRESENT_PREFIX) and value.ndim == 4 and value.shape[2] > 1:
                    result.sweep[position][name] = np.ascontiguousarray(value[:, :, -1:, :])
            if on_sweep is not None:
                on_sweep(k)
    result.wall_s = time.perf_counter() - start
    return result


def run_isolated(
    spec: RunSpec, on_step: Callable[[int], None] | None = None, timeout: float = 600, python: str | None = None,
    on_sweep: Callable[[int], None] | None = None, env_extra: dict[str, str] | None = None,
    runtime: str | None = None, on_schedule: Callable[[int], None] | None = None,
) -> RunResult:
    """Run ``spec`` in a subprocess; a segfault or a hang is a result (``crashed`` / ``timed-out``).

    ``python``: the interpreter to run it with (another onnxruntime installation), in the environment
    :func:`rope_passes.runtime.interpreters.child_env` gives ``runtime`` (this package on its ``PYTHONPATH``; numpy,
    onnx and onnx_ir must be importable there). ``env_extra``: variables set for the subprocess.
    """
    from rope_passes.runtime.interpreters import child_env

    start = time.perf_counter()
    env = child_env(runtime) if python else dict(os.environ)
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory(prefix="rope-check-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        err_path = Path(tmp) / "stderr.txt"
        with open(err_path, "w") as err:
            try:
                proc = subprocess.Popen([python or sys.executable, "-m", "rope_passes.check.runner", str(spec_path),
                                         tmp], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            except OSError as exc:
                return RunResult(spec.label, LOAD_FAILED, f"{NOT_STARTED} {python or sys.executable}: {exc.strerror}")
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith("STEP ") and on_step is not None:
                        on_step(int(line.split()[1]))
                    elif line.startswith("SWEEP ") and on_sweep is not None:
                        on_sweep(int(line.split()[1]))
                    elif line.startswith("SCHEDULE ") and on_schedule is not None:
                        on_schedule(int(line.split()[1]))
                    if time.perf_counter() - start > timeout:
                        raise subprocess.TimeoutExpired(proc.args, timeout)
                rc = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return RunResult(spec.label, TIMED_OUT, f"no result after {timeout:.0f} s",
                                 wall_s=time.perf_counter() - start)
        result_path = Path(tmp) / "result.json"
        if rc != 0 or not result_path.is_file():
            if rc < 0:
                try:
                    sig = signal.Signals(-rc).name
                except ValueError:
                    sig = f"signal {-rc}"
                reason = f"the onnxruntime process died with {sig}"
            else:
                reason = f"the worker exited with status {rc}"
            tail = [ln for ln in err_path.read_text(errors="replace").splitlines()
                    if ln.strip() and "maxDynamicUniformBuffersPerPipelineLayout" not in ln]
            if tail:
                reason += f": {' '.join(tail[-1].split())[:400]}"
            return RunResult(spec.label, CRASHED, reason, wall_s=time.perf_counter() - start)
        data = json.loads(result_path.read_text())
        if spec.graph_capture and data["status"] == OK:
            log = err_path.read_text(errors="replace")
            replays = log.count("Replaying the captured")
            data["notes"].append(f"onnxruntime logged {replays} replays of the captured graph")
        steps = []
        for k in range(data.pop("n_steps")):
            with np.load(Path(tmp) / f"step{k}.npz") as z:
                steps.append({name: z[name] for name in z.files})
        data.pop("steps_run", None)
        sweep = {}
        for p in data.pop("sweep_positions"):
            with np.load(Path(tmp) / f"sweep{p}.npz") as z:
                sweep[p] = {name: z[name] for name in z.files}
        errors = {int(p): e for p, e in data.pop("sweep_errors").items()}
        schedules = {}
        for i, (name, n) in enumerate(data.pop("schedules_run").items()):
            calls = []
            for k in range(n):
                with np.load(Path(tmp) / f"schedule{i}_{k}.npz") as z:
                    calls.append({name: z[name] for name in z.files})
            schedules[name] = calls
        return RunResult(steps=steps, sweep=sweep, sweep_errors=errors, schedules=schedules, **data)


def _worker(spec_path: str, out_dir: str) -> int:
    spec = RunSpec(**json.loads(Path(spec_path).read_text()))
    if os.environ.get("ROPE_PASSES_CHECK_WORKER_FAULT") == spec.label:  # test hook: an EP segfault, simulated
        os.kill(os.getpid(), signal.SIGSEGV)

    def on_step(k: int) -> None:
        print(f"STEP {k}", flush=True)

    def on_sweep(k: int) -> None:
        print(f"SWEEP {k}", flush=True)

    def on_schedule(k: int) -> None:
        print(f"SCHEDULE {k}", flush=True)

    def save(path: str, outs: dict[str, np.ndarray]) -> None:  # npz has no bfloat16: such outputs travel as float32
        arrays: dict[str, Any] = {n: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v)
                                  for n, v in outs.items()}  # Any: numpy's stub would read ** as allow_pickle
        np.savez(path, **arrays)

    result = execute_run(spec, on_step, capture_log=True, on_sweep=on_sweep, on_schedule=on_schedule)
    for k, outs in enumerate(result.steps):
        save(os.path.join(out_dir, f"step{k}.npz"), outs)
    for p, outs in result.sweep.items():
        save(os.path.join(out_dir, f"sweep{p}.npz"), outs)
    for i, calls in enumerate(result.schedules.values()):
        for k, outs in enumerate(calls):
            save(os.path.join(out_dir, f"schedule{i}_{k}.npz"), outs)
    data = result.to_dict()
    data.pop("steps_run")
    data["wall_s"] = result.wall_s
    data["n_steps"] = len(result.steps)
    Path(out_dir, "result.json").write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
