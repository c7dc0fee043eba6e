"""Equivalence checking on onnxruntime (CPU reference, WebGPU, graph capture)."""
