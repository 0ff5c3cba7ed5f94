"""Drafter acceptance on recorded vs served fc inputs: is low acceptance the wiring or the model?

A consumer of the engine's evidence (it never starts an engine, and knows no engine by name):

- :mod:`~specparity.replay.drafter`: the plain-torch EAGLE-3 drafter, SGLang 0.5.23's forward (one
  implementation; the bundled fixture trains through it). ``Eagle3Drafter.load(draft_dir, target_dir=...)``.
- :mod:`~specparity.replay.draft_config`: what a draft config asks of it, in SGLang-export or speculators format.
- :mod:`~specparity.replay.checkpoint`: safetensors-only tensor reads (sharded via the index).
- :mod:`~specparity.replay.acceptance`: per-position acceptance of a topk-1 chain over teacher-forced
  probes, censored where the probe text leaves the target's greedy path (product-limit estimate).
- :mod:`~specparity.replay.diagnosis`: ``healthy`` / ``wiring`` / ``model_quality`` and the findings
  ``acceptance_collapse`` / ``acceptance_below_contract``.
- :mod:`~specparity.replay.outcome`: ``check_outcome(contract, probes, capture, target=, draft=)``: the outcome of
  one engine run's evidence (the engine's own drafter replay and/or its serving loop's acceptance).
"""
