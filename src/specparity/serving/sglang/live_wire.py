"""What the gate and the SGLang hooks (``serving/sglang/live_hooks.py``) exchange through the evidence directory: its
layout and formats, the ARMED file's lease, the per-probe expectations the gate writes for the reduced evidence, and
the batch segments both sides read. A leaf of the hooks: the gate's side (``live.py``, ``live_records.py``) and the
hooks inside SGLang's server processes share it without importing each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

ARMED = "ARMED"
RECORDS = "records"
EXPECT = "expect"  # the gate's per-probe expectations while armed (reduced evidence)
EXPECT_FORMAT = "specparity-live-sglang-expect/1"
EVIDENCE_KEY = "evidence"  # a record's meta: "full" or "reduced"
REDUCED_META = "specparity_reduced/"  # + probe index: compare/reduced.py META_KEY's JSON, per probe
REDUCED_PREFIX = "reduced"  # tensors "reduced<i>/<stat>" of probe i
DIGEST_META = "specparity_fc_digest/"  # + probe index: a non-lead rank's SHA-256 of its fc rows
REDUCE_ERROR = "reduce_error"
AUX_HELD = "\0aux"  # the held aux rows, beside the boundaries (never a source name)
AUX_WIDTH = "aux_width"  # a reduced target record's meta: the aux states' width (the states themselves not kept)
LEASE = "lease"  # notes of the hooks disarming themselves: lease/<pid>.json
FACTORY_CALLS = "factory_calls"
READY = "ready"
RECORD_FORMAT = "specparity-live-sglang/1"


def evidence_dir_problem(path: Path) -> str | None:
    """Why ``path`` is not a safe evidence directory (not a directory, another owner, readable by others), or
    None."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o077:
        return f"{path} has mode {oct(st.st_mode & 0o777)}; evidence directories are 0700"
    return None


def lease_text(*, lease_s: float) -> str:
    """The ARMED file's content the gate writes: its pid, its pid namespace and the lease's deadline."""
    import time

    return json.dumps({"owner_pid": os.getpid(), "pid_ns": pid_ns(), "deadline": time.time() + lease_s})


def pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def read_lease(flag: str) -> dict[str, Any]:
    try:
        with open(flag) as f:
            lease = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return lease if isinstance(lease, dict) else {}


def lease_ended(lease: dict[str, Any]) -> str | None:
    """Why an armed lease has ended (its deadline passed; its owner, in this pid namespace, is gone), or None. An
    ARMED file without a lease (a gate before leases) never ends here."""
    import time

    deadline = lease.get("deadline")
    if isinstance(deadline, (int, float)) and time.time() > deadline:
        return f"lease expired at {deadline:.0f} (the gate did not disarm in time)"
    owner = lease.get("owner_pid")
    if isinstance(owner, int) and owner > 0 and lease.get("pid_ns") == pid_ns():
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            return f"the gate (pid {owner}) is gone"
        except OSError:
            pass  # alive, another user's
    return None


def segments(lens: Any, prefix: Any, pool: Any, rows: int) -> list[tuple[int, int, int, int]]:
    """``(row start, rows, prefix length, req_pool_index)`` per request, from a batch's ``extend_seq_lens``,
    ``extend_prefix_lens`` and ``req_pool_indices`` (one segment of ``rows`` rows where the batch has no lengths)."""
    if lens is None:
        return [(0, rows, 0, -1)]
    out, start = [], 0
    for j, n in enumerate(int(x) for x in lens.tolist()):
        out.append((start, n, int(prefix[j]) if prefix is not None else 0,
                    int(pool[j]) if pool is not None and j < len(pool) else -1))
        start += n
    return out


def read_expectations(evidence: Path) -> list[dict[str, Any]]:
    """The gate's per-probe expectations of this arming (``expect/p<i>.safetensors``), or [] (full evidence)."""
    folder = evidence / EXPECT
    if not folder.is_dir() or evidence_dir_problem(evidence) is not None:
        return []
    from safetensors import safe_open

    out = []
    for path in sorted(folder.glob("p*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
                if meta.get("format") != EXPECT_FORMAT:
                    continue
                spec = json.loads(meta["spec"])
                out.append({"index": int(spec["index"]), "ids": [int(t) for t in f.get_tensor("input_ids").tolist()],
                            "recorded": f.get_tensor("recorded"), "expected": list(spec["expected"]),
                            "rtol": dict(spec["rtol"]), "lead": int(spec["lead"]),
                            "served": str(spec.get("served") or "fc")})
        except Exception as exc:  # a torn or foreign file: no reduction from it (its probe's record stays full)
            sys.stderr.write(f"specparity live hook: expectation {path.name} not read: {type(exc).__name__}: {exc}\n")
    return out


def write_expectations(evidence: Path, probes: Any, recorded: Any, *, expected: list[str],
                       rtol: dict[str, list[float]], lead: int = 0, served: str = "fc") -> None:
    """The gate's side: one expectation file per probe (written before arming; removed after the probe run)."""
    import torch

    folder = evidence / EXPECT
    folder.mkdir(mode=0o700, exist_ok=True)
    for i, (probe, rec) in enumerate(zip(probes, recorded, strict=True)):
        spec = {"index": i, "expected": list(expected), "rtol": rtol, "lead": lead, "served": served}
        save_atomic({"input_ids": torch.tensor([int(t) for t in probe], dtype=torch.int64),
                      "recorded": rec.detach().to("cpu").contiguous()},
                     {"format": EXPECT_FORMAT, "spec": json.dumps(spec)}, folder / f"p{i:05d}.safetensors")


def save_atomic(tensors: dict[str, Any], meta: dict[str, str], final: Path) -> None:
    from safetensors.torch import save_file

    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
