"""compare: what training recorded against what the engine served. Knows nothing of SGLang, vLLM or pytest.

- ``attribution``: every served and recorded fc chunk named by the atlas boundary it carries; its scan over every
  sample is ``attribution_scan``, one sample's pass over the atlas ``scan``.
- ``evidence``: direct served-vs-recorded numbers per chunk (exact errors, token shifts, scale).
- ``tolerances``: dtype-aware thresholds and the minimum tolerance that would have passed.
- ``diagnosis``: all findings at once from attribution plus deployment facts.
- ``configdiff``: the contract against a contract-shaped view of the deployment (deepdiff).
- ``fix``: the draft-config JSON patch / server flags that make the engine serve the contract.
- ``findings``: the typed finding vocabulary every reporter renders.
- ``synthetic``: residual streams with realistic layer-to-layer correlation (tests, benchmarks).

Submodules are imported explicitly; importing this package pulls in no torch.
"""
