"""bfloat16 GroupQueryAttention: a fact ``total-seq-on-gpu``, ``narrow-int64`` and lint (RP207) share.

No WebGPU runtime here has a bf16 GroupQueryAttention kernel (both probed kernel tables in ``rope_passes/runtime_tables``
register GQA for T = float16/float only), nor onnxruntime-webgpu 1.27's CPU EP (a one-node bf16 GQA session fails:
"Could not find an implementation for GroupQueryAttention"): moving such a model's int64 plumbing cannot help.
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.report import PassReport

#: what the passes and lint say about a bf16 GroupQueryAttention. Both WebGPU runtimes' probed kernel tables
#: (rope_passes/runtime_tables) register GQA for T = float16/float only, and a one-node bf16 GQA session fails on
#: onnxruntime-webgpu 1.27's CPU EP too ("Could not find an implementation for GroupQueryAttention")
BF16_GQA_NOTE = ("GroupQueryAttention is bfloat16: neither WebGPU runtime (onnxruntime-webgpu 1.27, onnxruntime 1.31 "
                 "+ the WebGPU plugin EP) nor 1.27's CPU EP has a bf16 GroupQueryAttention kernel, so the model does "
                 "not run there whatever its int64 plumbing; rewriting that cannot help. Build it in fp16 or fp32")


def bf16_gqa(model: ir.Model) -> list[ir.Node]:
    """The GroupQueryAttention nodes whose query (input 0), or first output, is bfloat16."""
    out = []
    for gqa in nodes_of(model, "GroupQueryAttention", MS_DOMAIN):
        value = gqa.inputs[0] if gqa.inputs and gqa.inputs[0] is not None else gqa.outputs[0]
        if value.dtype == ir.DataType.BFLOAT16:
            out.append(gqa)
    return out


def note_bf16(model: ir.Model, report: PassReport) -> bool:
    """Record :data:`BF16_GQA_NOTE` once (and "not matched") when the model's GQA is bf16; True if it is."""
    found = bf16_gqa(model)
    if found:
        report.note(found[0], BF16_GQA_NOTE, gqa=len(found))
        report.not_matched("<model>", "GroupQueryAttention is bfloat16: no onnxruntime kernel for it here, nothing "
                           "to move to the GPU")
    return bool(found)


__all__ = ["BF16_GQA_NOTE", "bf16_gqa", "note_bf16"]
