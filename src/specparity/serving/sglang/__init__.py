"""SGLang's room: ``client.py`` the parent side (resolve, capture), ``worker.py`` the child, ``engine.py`` the
:class:`~specparity.serving.engine.Engine` it implements, ``explain.py``, ``families.py`` (releases -> families) and
one folder per family with the adapter the child runs. Imports nothing of SGLang here: the child imports it."""
