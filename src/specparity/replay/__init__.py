"""Drafter acceptance on recorded vs served fc inputs: is low acceptance the wiring or the model?

- :mod:`~specparity.replay.drafter`: the plain-torch EAGLE-3 drafter, SGLang 0.5.23's forward (one
  implementation; the bundled fixture trains through it). ``Eagle3Drafter.load(draft_dir, target_dir=...)``.
- :mod:`~specparity.replay.checkpoint`: safetensors-only tensor reads (sharded via the index).
- :mod:`~specparity.replay.acceptance`: per-position acceptance of a topk-1 chain over teacher-forced
  probes, censored where the probe text leaves the target's greedy path (product-limit estimate).
- :mod:`~specparity.replay.served`: SGLang's real drafter on both inputs, in the capture child.
- :mod:`~specparity.replay.diagnosis`: ``healthy`` / ``wiring`` / ``model_quality`` and the findings
  ``acceptance_collapse`` / ``acceptance_below_contract``.
- :mod:`~specparity.replay.outcome`: ``check_outcome(contract, probes, target=, draft=)`` ties them together.
"""
