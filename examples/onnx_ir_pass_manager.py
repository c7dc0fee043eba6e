"""rope-passes passes are onnx_ir passes: run them inside your own onnx_ir PassManager (e.g. in an export script).

    python examples/onnx_ir_pass_manager.py MODEL_DIR OUT_DIR [--text-only]

The passes of one run share a ``PassContext``: it carries the model's ``genai_config.json`` (a typed
``GenaiConfig``), so what ``longrope-concat`` writes there (the cache offset) or ``fold-text-mrope`` removes from it
(the position input) reaches the next pass and the saved folder, exactly as ``rope-passes optimize`` does; with the
same last step (``capture_config``: ``enableGraphCapture`` from the output's capture verdict) the output is
byte-identical to ``rope-passes optimize MODEL_DIR -o OUT_DIR --preset webgpu-graph``.

Each pass carries its contracts here too (``RopePass.call``): a pass whose output would not be a valid model where
its input was (a node outside its schema at the model's opset, a model onnxruntime no longer loads) or whose WebGPU
placement would be worse is rolled back, and its status says why.
"""

from __future__ import annotations

import argparse

import onnx_ir as ir

from rope_passes import load_bundle, save_bundle
from rope_passes.api import RUNTIME_METADATA_KEY, capture_config
from rope_passes.passes import PassContext
from rope_passes.plan import make_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--text-only", action="store_true")
    args = ap.parse_args()

    bundle = load_bundle(args.model_dir)  # onnx_ir model (weights stay on disk) + its genai_config.json
    # the run: the webgpu-graph preset for the WebGPU runtime installed here (the downlevel passes it needs), each
    # pass with its options (one pass by hand reads the same: FoldTextMRoPEPass(context, text_only=True))
    plan = make_plan("webgpu-graph", options={"text_only": True} if args.text_only else None)
    context = PassContext(bundle.genai_config, runtime=plan.runtime)
    passes = plan.build(context)
    result = ir.passes.PassManager(passes)(bundle.model)
    for p in passes:
        print(f"{p.name}: {p.report.status}")
    bundle.model = result.model
    if result.modified:  # as optimize does: a rewritten graph names the runtime its passes were chosen for
        bundle.model.metadata_props[RUNTIME_METADATA_KEY] = plan.runtime.name
    # as optimize does for webgpu-graph: genai_config.json's enableGraphCapture made to agree with the output's capture
    # verdict ("1" when capture-ready, so onnxruntime-genai captures the folder as it is)
    capture = capture_config(bundle, plan.runtime)
    print(f"graph capture: {capture['verdict']}; {capture['config']}")
    # save_bundle: IR version <= 13 (onnxruntime 1.27), external data beside the model, the folder copied whole,
    # genai_config.json written from the context the passes changed; nothing changed: a byte-for-byte copy
    save_bundle(bundle, args.out_dir, graph_modified=result.modified)


if __name__ == "__main__":
    main()
