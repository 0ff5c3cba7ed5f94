"""A temp directory of a run's own for the engine processes we start, so what they leave there goes with the run.

Engines leave files in the temp directory and never remove them: SGLang an empty IPC placeholder per server process
(0.5.23 ``server_args.py:781,807-812``, ``NamedTemporaryFile(delete=False)``); vLLM its ZeroMQ socket files
(``ipc://<tmp>/<uuid4>``, vllm 0.32 ``utils/network_utils.py:176``) and, from 0.32, the ``file://<tmp>/vllm_dist_*``
rendezvous of its executors (``network_utils.py:153``, ``v1/executor/uniproc_executor.py:84``,
``multiproc_executor.py:143``), which torch's FileStore removes only when every rank closes it cleanly. torch's inductor
cache lives in the temp directory too (``<tmp>/torchinductor_<user>``, ``torch/_inductor/runtime/cache_dir_utils.py``)
but is a cache across runs: :func:`scratch_env` points it where torch would have put it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

# A socket path holds at most 107 bytes (sockaddr_un) and vLLM's IPC sockets are <TMPDIR>/<uuid4>: a scratch TMPDIR
# longer than this is not given (the process keeps the temp directory it had)
SCRATCH_MAX = 107 - len("/") - 36


def inductor_cache_default() -> str:
    """Where torch keeps its inductor cache when nothing says otherwise (cache_dir_utils.py:24-34, non-fbcode)."""
    try:
        import getpass

        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def scratch_env(folder: Path, given: Mapping[str, str]) -> dict[str, str]:
    """``TMPDIR`` (``folder``, made 0700) and, unless ``given`` or this environment names it, ``TORCHINDUCTOR_CACHE_DIR``
    at torch's default; nothing where ``given`` sets ``TMPDIR`` itself or ``folder`` is too long for a socket path."""
    if "TMPDIR" in given or len(str(folder)) > SCRATCH_MAX:
        return {}
    folder.mkdir(mode=0o700, exist_ok=True)
    out = {"TMPDIR": str(folder)}
    if "TORCHINDUCTOR_CACHE_DIR" not in given and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        out["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_default()
    return out
