"""WebGPU is really used: a session on WebGpuExecutionProvider runs a graph, without silent CPU fallback.

These tests fail (never skip) when no adapter exists: run scripts/setup.sh, which installs Mesa lavapipe.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from rope_passes.runtime.adapter import probe, tiny_add_model
from rope_passes.runtime.sessions import WEBGPU, create_session


def test_webgpu_provider_is_in_this_onnxruntime():
    assert WEBGPU in ort.get_available_providers(), ort.get_available_providers()


@pytest.mark.webgpu
def test_webgpu_session_runs_on_webgpu():
    reason = probe()
    assert reason is None, f"no WebGPU adapter: {reason}"
    sess = create_session(tiny_add_model(), "webgpu")
    assert sess.get_providers()[0] == WEBGPU
    x = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], 2 * x)  # exact in fp32


@pytest.mark.webgpu
def test_webgpu_profile_shows_the_node_ran_on_webgpu(tmp_path):
    """The profiler's own record: the Add kernel executed on the WebGPU EP, not on CPU."""
    import json

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = create_session(tiny_add_model(), "webgpu", so=so)
    sess.run(None, {"x": np.ones(4, np.float32)})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    providers = {e["args"].get("provider") for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})}
    assert providers == {WEBGPU}, providers
