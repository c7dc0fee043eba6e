"""A runtime's own error on the original is not the rewrite's (issue 28: the browser's WebGPU is 5e-4 from the CPU
EP on legacy/qwen25_vl's explicit mRoPE rotation, the original's run alike, over fp32's 1e-4).

``rewritten@webgpu vs original@cpu`` stops counting only where the rewritten graph equals its original on the same
runtime (a counted comparison that passed) and is, step by step and output by output, no further from the CPU EP
than the original there (within the tolerance). Built from comparisons directly: the rule, not a runtime, is tested.
"""

from __future__ import annotations

from rope_passes.check.compare import TOLERANCES, Comparison, OutputDiff
from rope_passes.check.evidence.decode import own_error

FP32 = TOLERANCES["fp32"]


def _comparisons(rew_cpu: float, orig_cpu: float, rew_web: float = 0.0) -> list[Comparison]:
    def c(actual, reference, counts, err):
        return Comparison(actual, reference, FP32, counts,
                          [OutputDiff(0, "logits", err, err, err <= FP32.atol), OutputDiff(1, "logits", 1e-6, 1e-6,
                                                                                         True)])
    return [c("rewritten@webgpu", "original@webgpu", True, rew_web), c("rewritten@webgpu", "original@cpu", True, rew_cpu),
            c("original@webgpu", "original@cpu", False, orig_cpu)]


def test_the_runtimes_own_error_does_not_count_against_the_rewrite():
    comps = _comparisons(rew_cpu=5.0e-4, orig_cpu=5.0e-4)  # bit-identical on the runtime, both 5e-4 from CPU
    own_error(comps, "rewritten@webgpu")
    cross = comps[1]
    assert not cross.counts and "the runtime itself is 0.0005 from the CPU EP" in cross.reason


def test_an_error_of_the_rewrite_s_own_still_counts():
    further = _comparisons(rew_cpu=9.0e-4, orig_cpu=5.0e-4)  # 4e-4 further than the original: its own
    own_error(further, "rewritten@webgpu")
    assert further[1].counts and not further[1].reason
    differs = _comparisons(rew_cpu=5.0e-4, orig_cpu=5.0e-4, rew_web=3e-4)  # not equal to its original on WebGPU
    own_error(differs, "rewritten@webgpu")
    assert differs[1].counts
    fine = _comparisons(rew_cpu=5.0e-4, orig_cpu=5.0e-6)  # the runtime is right on the original: the rewrite's
    own_error(fine, "rewritten@webgpu")
    assert fine[1].counts
