"""Where a WebGPU runtime runs each node, which Memcpy nodes it inserts, and whether graph capture can start: a static
prediction, no session (:func:`predict_placement`), for one runtime target (:mod:`rope_passes.runtimes`:
onnxruntime-webgpu 1.27, or onnxruntime ≥ 1.31 + the WebGPU plugin EP; default: the one installed here).

It replays onnxruntime's own partitioning rules on the target's probed kernel table
(:class:`rope_passes.webgpu_kernels.KernelTable`) and the kernels' memory types (:mod:`rope_passes.webgpu_kernels`);
the runtime truth it is checked against on the whole genai corpus and the builder fixtures, on both runtimes
(tests/test_placement.py), is :func:`rope_passes.runtime.placement_probe.probe_placement`, a session with verbose
logging. Model-local functions are inlined first, as onnxruntime does at load (:func:`.ort_rewrites.inline_functions`). One module per responsibility: :mod:`.result` (what a prediction says), :mod:`.dtypes` (element types as
onnxruntime infers them), :mod:`.ort_rewrites` (onnxruntime's transforms before partitioning, replayed),
:mod:`.predict` (the prediction and the capture verdict).

1. a node gets WebGPU when the target's WebGPU kernel registry has a kernel for its op and input type at the model's
   opset (``target.kernels``, probed); ``Shape`` of an int64 tensor has none, and every ``Shape`` output lives in CPU
   memory (:data:`rope_passes.webgpu_kernels.CPU_OUTPUTS`), so shape math starts on CPU. With
   ``enableGraphCapture=1`` the EP also registers its int64 kernels, which changes the table;
2. shape math downstream of ``Shape`` lands on CPU where its int64 ops have no WebGPU kernel (without capture, none;
   with capture, 1.27 has int64 kernels for ``Cast``/``Expand``/``Range``/``Unsqueeze`` only, the plugin for many
   more, ``Gather`` among them). The WebGPU EP does
   not apply onnxruntime's ``GetCpuPreferredNodes`` heuristic (measured: an int32 ``ReduceSum`` fed only by a CPU
   ``Cast`` and a small initializer stays on WebGPU, with a Memcpy), so neither does this prediction. Before
   partitioning onnxruntime merges identical nodes (``CommonSubexpressionElimination``); the prediction does too, and
   a Memcpy on a merged tensor may carry any of its names (:attr:`Memcpy.aliases`). It also reads
   ``Shape(Cast(x))``/``Shape(Identity(x))`` as ``Shape(x)`` when the Cast/Identity feeds only Shape nodes
   (:func:`shape_bypass`);
3. Memcpy (``transformer_memcpy``): ``MemcpyFromHost`` after a tensor produced on CPU (or a graph input also read
   by CPU nodes) that a WebGPU node reads in GPU memory; ``MemcpyToHost`` before a tensor produced on WebGPU that a
   CPU node reads, or that a WebGPU kernel reads in CPU memory (:data:`rope_passes.webgpu_kernels.CPU_INPUTS`,
   e.g. ``Reshape``'s shape). Initializers and ``Constant`` outputs never need one (onnxruntime copies them per device);
4. graph capture is refused for control flow (``If``/``Loop``/``Scan``) first, then for any Memcpy.
"""

from __future__ import annotations

from rope_passes.analysis.placement.dtypes import Dtypes, value_dtype
from rope_passes.analysis.placement.ort_rewrites import common_subexpressions, maybe_folded, shape_bypass
from rope_passes.analysis.placement.predict import CONTROL_FLOW, capture_verdict, check_loadable, predict_placement
from rope_passes.analysis.placement.result import Memcpy, Placement

__all__ = ["CONTROL_FLOW", "Dtypes", "Memcpy", "Placement", "capture_verdict", "check_loadable",
           "common_subexpressions", "maybe_folded", "predict_placement", "shape_bypass", "value_dtype"]
