"""Each serving engine's id rules: what a draft config's aux layer ids mean to that engine, as canonical sources.

Pure functions with every rule citing the engine's file:line; no engine is imported. One module per engine:

- :mod:`specparity.idrules.sglang`: SGLang's ``set_eagle3_layers_to_capture`` rules, per release and setter family,
  and their inverse (which draft-config ids serve given sources).
- :mod:`specparity.idrules.vllm`: vLLM's reader (which key, the default, no ``+1``), the drafter's fc width and
  the draft-config patch.

They sit below ``contract/`` because a training tool's ids are an engine's ids: SpecForge hands its ids to the
target's SGLang setter, speculators writes vLLM's. The contract (``contract/conventions.py``) maps each training
tool's convention through these rules; the engines (``serving/<engine>/``) expose them through
``serving.engine.Engine``.
"""
