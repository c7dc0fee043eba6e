"""The proofs layer: what the passes and lint prove about a graph, in one home below both.

* :mod:`.constants`: the one constant evaluator (a value, or "not a constant"; never a question about node types);
* :mod:`.intervals`: integer ranges of int64 values (graph inputs as documented assumptions);
* :mod:`.known` / :mod:`.cone`: the cone accounting (each row a function of its own position);
* :mod:`.positions`: position sources made in the graph (a Range proved never negative) and the numeric probes;
* :mod:`.chain`: a per-call cos/sin chain as the exporter pass and lint read it;
* :mod:`.config`: a chain against the Hugging Face config (the numeric evidence for RP4xx and the repair).

It imports ``analysis``, ``runtime`` (numeric evidence on onnxruntime CPU) and the base modules, never ``passes`` or
``lint``; reading a model for a proof never changes it.
"""
