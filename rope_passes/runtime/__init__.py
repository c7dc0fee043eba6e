"""Everything that opens an onnxruntime session. No module outside this package creates one (the checker included:
its runs, on either WebGPU runtime, open theirs with :func:`.sessions.create_session`; tests/test_architecture.py
finds every ``InferenceSession(`` call).

* :mod:`.sessions` — ``session_options`` (WebGPU provider options as ``ep.webgpuexecutionprovider.<key>`` session
  config entries: a provider dict is silently ignored) and ``create_session``, which raises
  ``WebGPUUnavailableError`` instead of silently falling back to CPU, on onnxruntime-webgpu 1.27 or on onnxruntime
  with the WebGPU plugin EP (``onnxruntime_ep_webgpu``), whichever is installed.
* :mod:`.adapter` — does onnxruntime get a WebGPU adapter (``probe``; ``python -m rope_passes.runtime.adapter``, run by
  scripts/setup.sh), and is it a software one such as Mesa lavapipe (``adapter_info``, ``max_webgpu_prefill``).
* :mod:`.evaluate` — ``evaluate_subgraph``: a small subgraph on the CPU EP, the numbers behind the passes' numeric
  proofs.
* :mod:`.placement_probe` — ``probe_placement``: the runtime truth of node placement, Memcpy nodes and the graph
  capture verdict (a session in a subprocess with verbose logging), which the static prediction
  (:mod:`rope_passes.analysis.placement`) is tested against.

The rule: ``rope_passes.analysis`` never imports this package (nor ``onnxruntime``): analysis is pure graph reasoning,
on measured facts stored as data (``runtime_tables/<runtime>.json`` via :mod:`rope_passes.runtimes`,
``webgpu_kernels.json``). Dependencies point one way, runtime -> analysis.
tests/test_architecture.py enforces it.
"""
