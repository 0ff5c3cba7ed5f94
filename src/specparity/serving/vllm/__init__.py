"""vLLM's room: ``client.py`` the parent side (resolve, capture), ``worker.py`` the child, ``tap.py`` the
``vllm.general_plugins`` entry point in vLLM's own workers, ``engine.py`` the :class:`~specparity.serving.engine.Engine`
it implements, ``explain.py`` and ``versions.py``. Imports nothing of vLLM here: the child imports it."""
