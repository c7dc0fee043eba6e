"""rope-passes passes are onnx_ir passes: use them inside your own onnx_ir PassManager (e.g. in an export script).

    python examples/onnx_ir_pass_manager.py MODEL.onnx OUT.onnx
"""

from __future__ import annotations

import sys

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from rope_passes.passes import ALL_PASSES


def main(src: str, dst: str) -> None:
    model = ir.load(src)
    passes = [ALL_PASSES[name](text_only=False) for name in ("fold-text-mrope", "cleanup")]
    manager = ir.passes.PassManager([*passes, RemoveUnusedNodesPass()])
    result = manager(model)
    for p in passes:
        print(f"{p.name}: {p.report.status}")
    result.model.ir_version = min(result.model.ir_version, 13)  # onnxruntime 1.27 rejects IR 14
    ir.save(result.model, dst, external_data=dst.rsplit("/", 1)[-1] + ".data")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
