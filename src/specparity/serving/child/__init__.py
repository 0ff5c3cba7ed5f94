"""The child-process machinery both engines share: one child per job in its own process group (``process.py``,
``run.py``), the warm start (``zygote.py``, ``warm.py``), the process-tree reaper (``reaper.py``), private temp
directories (``scratch.py``), the result's transport (``transport.py``), what both workers share
(``worker_common.py``) and an exception's text (``exception_text.py``)."""
