"""SGLang with the worker-v2 API: rows C, D and E of ``families.py`` (0.5.11 on; domain.md §6).

``core.py`` the adapter on the 0.5.23 layout, ``adapter.py`` the registry hook that adds the feature-detected glue
of the releases before it, ``run.py`` start-up and batches, ``static.py`` the static level on real objects, and the
older releases' paths: ``run_compat.py`` (0.5.11-0.5.21) and ``static_compat.py`` (0.5.11-0.5.15, before the 0.5.23
module layout). Every module but this one imports sglang: loaded only in the serving child.
"""
