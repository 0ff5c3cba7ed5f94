"""SGLang before the worker-v2 API: rows A and B of ``families.py`` (0.4.4.post2-0.5.10; domain.md §6).

``core.py`` the adapter (``LegacyAdapter``: ModelRunner-level start-up, capture and atlas), ``adapter.py`` row B's
registry hook (glue found by feature detection), ``static_only.py`` row A's (static level only: its releases ignore
the configured ids), ``run.py`` start-up and batches, ``static.py`` the static level, ``glue.py`` the pinned glue of
0.4.10.post2 and 0.5.3, ``shims.py`` the old-SGLang CPU shims, ``common.py`` what core and static share.
Every module but this one imports sglang: loaded only in the serving child.
"""
