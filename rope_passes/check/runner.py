"""One decode run of one graph on one execution provider, in this process or isolated in a subprocess: the one run
loop of every runtime (:func:`execute_run`, its runtimes as backends: :mod:`rope_passes.check.backends`).

A run is described by a :class:`RunSpec` (plain data, JSON-serialisable) so the same description runs in-process or in
``python -m rope_passes.check.runner SPEC.json OUT_DIR``. Isolation matters: onnxruntime-webgpu has been seen to
segfault on some graphs (and under graph capture); in a subprocess a crash is a reported result
(``status="crashed"``, with the signal), not the end of the checker.

The worker prints ``<what> k`` after each call (``step``, ``sweep`` or ``schedules``: :data:`Progress`) so the
parent can drive a progress bar, writes every output of every call to ``arrays.npz`` (where each belongs: in
``result.json``, with the outcome). Under another interpreter (``python=``: the other WebGPU runtime's, from
:func:`rope_passes.runtimes.installed.python_for`) the worker runs with this repository on its ``PYTHONPATH``
(:func:`rope_passes.runtimes.installed.child_env`). Every session, on either runtime, comes from
:func:`rope_passes.runtime.sessions.create_session` (the plugin EP registered once per process, no silent CPU
fallback).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rope_passes.check.decode import PRESENT_PREFIX, DecoderSpec, random_feeds, run_decode, token_ids
from rope_passes.check.spec import (
    CRASHED,
    LOAD_FAILED,
    NOT_RUN,
    NOT_STARTED,
    OK,
    RUN_FAILED,
    TIMED_OUT,
    RunResult,
    RunSpec,
)
from rope_passes.check.spec import one_line as _one_line
from rope_passes.errors import UsageError

if TYPE_CHECKING:
    from rope_passes.check.backends import RunBackend


#: progress of a run: ``(what, k)`` after its ``k``-th call of ``what`` (``step`` of the decode, ``sweep`` position,
#: ``schedules``)
Progress = Callable[[str, int], None]


def execute_run(spec: RunSpec, backend: RunBackend | None = None, progress: Progress | None = None) -> RunResult:
    """Run ``spec`` in this process on ``backend`` (default: onnxruntime here, :class:`.backends.native.
    NativeBackend`); every failure becomes a status with a one-line reason. The one run loop of every runtime: open
    a session (or a capture driver), the decode, then the schedules and the sweep (:mod:`.backends`)."""
    if backend is None:
        from rope_passes.check.backends.native import NativeBackend

        backend = NativeBackend()
    say = progress or (lambda what, k: None)
    on_step = functools.partial(say, "step")
    start = time.perf_counter()
    try:
        label = backend.start()
    except Exception as exc:  # noqa: BLE001 - a runtime that does not start is a result
        return RunResult(spec.label, LOAD_FAILED, f"cannot start {backend.what}: {_one_line(exc)}",
                         wall_s=time.perf_counter() - start)
    result = RunResult(spec.label, OK, runtime=label, notes=backend.notes())
    table = np.load(spec.embedding) if spec.embedding else None
    session: Any = None
    driver: Any = None
    dspec = None
    try:
        if spec.graph_capture:
            driver = backend.capture(spec, table)
            result.providers = list(driver.providers)
        else:
            session = backend.open(spec)
            result.providers = backend.providers(session)
    except UsageError as exc:  # the checker cannot drive this graph: not a property of the graph
        result.status, result.reason = NOT_RUN, _one_line(exc)
    except Exception as exc:  # noqa: BLE001 - a model that does not load is a result
        result.status, result.reason = LOAD_FAILED, _one_line(exc)
    if not result.ok:
        backend.close(None, result)
        result.wall_s = time.perf_counter() - start
        return result
    try:
        if driver is not None:
            driver.run(on_step=on_step, results=result.steps)
            result.notes.extend(driver.notes)
        else:
            dspec = backend.decoder_spec(session, spec, table)
            if dspec.is_decoder:
                tokens = token_ids(spec.prefill + spec.steps, spec.seed, spec.vocab)
                run_decode(session, dspec, tokens, spec.prefill, spec.steps, on_step=on_step, results=result.steps)
            else:
                feeds = random_feeds(dspec, spec.seed)
                result.steps = [dict(zip(dspec.outputs, session.run(dspec.outputs, feeds)))]
                on_step(0)
    except UsageError as exc:  # e.g. a capture output dimension the checker cannot size: no run happened
        result.status, result.reason = NOT_RUN, _one_line(exc)
    except Exception as exc:  # noqa: BLE001
        result.status, result.reason = RUN_FAILED, _one_line(exc)
        result.failed_step = len(result.steps)
    if dspec is not None and dspec.is_decoder and (result.ok or backend.after_failure):
        _schedules(spec, backend, session, dspec, result, functools.partial(say, "schedules"))
        _sweep(spec, session, dspec, result, functools.partial(say, "sweep"))
    if result.status in (OK, RUN_FAILED):
        _parts(spec, backend, table, result, session, dspec)
    backend.close(driver if driver is not None else session, result)
    result.wall_s = time.perf_counter() - start
    return result


def _schedules(spec: RunSpec, backend: RunBackend, session: Any, dspec: DecoderSpec, result: RunResult,
               on_schedule: Callable[[int], None]) -> None:
    """Every schedule of ``spec`` (a reference's twice and row by row where the backend makes those)."""
    from rope_passes.check.schedule_runs import run_reference, run_schedule
    from rope_passes.check.schedules import from_spec

    twice = (spec.schedules_twice or None) if backend.reference_runs else None
    for k, data in enumerate(spec.schedules):
        schedule = from_spec(data)
        try:
            if backend.reference_runs:
                run_reference(session, dspec, schedule, twice, result.schedules)
            else:  # each schedule once: no second pass, no row alone
                run_schedule(session, dspec, schedule, result.schedules.setdefault(data["name"], []))
        except Exception as exc:  # noqa: BLE001 - a call that raises is a result; the calls before it are kept
            result.schedule_errors[data["name"]] = _one_line(exc)
        on_schedule(k)


def _parts(spec: RunSpec, backend: RunBackend, table: np.ndarray | None, result: RunResult, session: Any,
           dspec: DecoderSpec | None) -> None:
    """Every kind of evidence's part of this run (:mod:`.evidence`), on the same backend and session, after its
    own."""
    from rope_passes.check.evidence import kind

    for name, data in spec.parts.items():
        try:
            result.parts[name] = kind(name).run(backend, spec, table, data, session=session, dspec=dspec)
        except Exception as exc:  # noqa: BLE001 - a part that raises is a result
            result.part_errors[name] = _one_line(exc)


def _sweep(spec: RunSpec, session: Any, dspec: DecoderSpec, result: RunResult, on_sweep: Callable[[int], None]) -> None:
    from rope_passes.check.sweep import run_sweep

    for k, position in enumerate(spec.sweep):
        run_sweep(session, dspec, [position], spec.seed, result.sweep, result.sweep_errors)
        # the past in present.* is the random input, the new token's row is what the graph computed: keep that
        # (a long table's last positions would otherwise hold GBs of copied past per run)
        for name, value in result.sweep.get(position, {}).items():
            if name.startswith(PRESENT_PREFIX) and value.ndim == 4 and value.shape[2] > 1:
                result.sweep[position][name] = np.ascontiguousarray(value[:, :, -1:, :])
        on_sweep(k)


def run_isolated(spec: RunSpec, progress: Progress | None = None, timeout: float = 600, python: str | None = None,
                 env_extra: dict[str, str] | None = None, runtime: str | None = None) -> RunResult:
    """Run ``spec`` in a subprocess; a segfault or a hang is a result (``crashed`` / ``timed-out``).

    ``python``: the interpreter to run it with (another onnxruntime installation), in the environment
    :func:`rope_passes.runtimes.installed.child_env` gives ``runtime`` (this package on its ``PYTHONPATH``; numpy,
    onnx and onnx_ir must be importable there). ``env_extra``: variables set for the subprocess.
    """
    from rope_passes.runtimes.installed import child_env

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
                    what, _, k = line.partition(" ")
                    if progress is not None and what in ("step", "sweep", "schedules"):
                        progress(what, int(k))
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
        homes: dict[str, Any] = {"steps": [{} for _ in range(data.pop("n_steps"))],
                                 "sweep": {p: {} for p in data.pop("sweep_positions")},
                                 "schedules": {n: [{} for _ in range(k)] for n, k in data.pop("schedules_run").items()},
                                 "parts": {n: [{} for _ in range(k)] for n, k in data.pop("parts_run").items()}}
        with np.load(Path(tmp) / "arrays.npz") as z:
            for i, (home, *at, name) in enumerate(data.pop("arrays")):
                place = homes[home]
                for key in at:
                    place = place[key]
                place[name] = z[f"a{i}"]
        errors = {int(p): e for p, e in data.pop("sweep_errors").items()}
        return RunResult(sweep_errors=errors, **homes, **data)


def _places(result: RunResult) -> Iterator[tuple[list[Any], dict[str, np.ndarray]]]:
    """Where every call's outputs of ``result`` belong (``["steps", k]``, ``["sweep", p]``, ``["schedules", name,
    k]``, ``["parts", name, k]``), and the outputs."""
    yield from ((["steps", k], outs) for k, outs in enumerate(result.steps))
    yield from ((["sweep", p], outs) for p, outs in result.sweep.items())
    for home, calls in (("schedules", result.schedules), ("parts", result.parts)):
        yield from (([home, name, k], outs) for name, made in calls.items() for k, outs in enumerate(made))


def _worker(spec_path: str, out_dir: str) -> int:
    spec = RunSpec(**json.loads(Path(spec_path).read_text()))
    if os.environ.get("ROPE_PASSES_CHECK_WORKER_FAULT") == spec.label:  # test hook: an EP segfault, simulated
        os.kill(os.getpid(), signal.SIGSEGV)
    from rope_passes.check.backends.native import NativeBackend

    result = execute_run(spec, NativeBackend(capture_log=True), lambda what, k: print(f"{what} {k}", flush=True))
    arrays: dict[str, Any] = {}  # Any: numpy's stub would read ** as allow_pickle
    index: list[list[Any]] = []
    for at, outs in _places(result):
        for name, value in outs.items():  # npz has no bfloat16: such outputs travel as float32
            arrays[f"a{len(index)}"] = value.astype(np.float32) if value.dtype.name == "bfloat16" else value
            index.append([*at, name])
    np.savez(os.path.join(out_dir, "arrays.npz"), **arrays)
    data = result.to_dict()
    data.pop("steps_run")
    data.update(wall_s=result.wall_s, n_steps=len(result.steps), arrays=index)
    Path(out_dir, "result.json").write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
