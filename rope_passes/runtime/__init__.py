"""Everything that opens an onnxruntime session: numeric evaluation for the passes' proofs (``evaluate``), and, as
the restructuring lands, the WebGPU sessions, the adapter probe and the placement probe.

``rope_passes.analysis`` never imports this package's sessions: analysis is pure graph reasoning.
"""
