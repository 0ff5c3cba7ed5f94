"""Reading the deploy command: the engine's own parse of it, run in the engine's interpreter (``parse.py``, the parent
side; ``parse_child.py``, what both engines' ``command_parse.py`` children share), and the findings it gives
(``findings.py``)."""
