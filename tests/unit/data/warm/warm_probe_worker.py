"""A worker module for the zygote's own tests (tests/unit/test_warm_start.py): no engine, just the protocol.

``warm`` records the zygote's pid and marks this module warm; ``run`` follows the job's request
(a JSON file): write a result, sleep (with a grandchild in its session), or die without a result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

WARMED_IN: int | None = None
JOBS_SEEN: list[str] = []  # module state a job sets: a later job must not see it


def warm(device: str) -> dict[str, object]:
    global WARMED_IN
    WARMED_IN = os.getpid()
    return {"device": device}


def run(argv: list[str], state: dict[str, object] | None) -> int:
    req = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    JOBS_SEEN.append(req["name"])
    print("@@specparity-progress 1 2", flush=True)
    if req.get("sleep"):
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (out.parent / "grandchild.pid").write_text(str(grandchild.pid))
        time.sleep(float(req["sleep"]))
    if req.get("die"):
        print("dying on purpose", file=sys.stderr, flush=True)
        os._exit(7)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "warmed_in": WARMED_IN,
        "jobs_seen": list(JOBS_SEEN), "state": state}))
    return 0
