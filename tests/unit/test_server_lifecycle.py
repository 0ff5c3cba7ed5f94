"""A server's life as the gate runs it (serving/live/server.py, serving/child/reaper.py), on a real HTTP server process: up,
health, stop with its whole tree; a server that dies or never answers; and nothing left when the gate itself is
killed (SIGKILL: the watchdog) or interrupted (SIGTERM: the finally blocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.process_marks import gone, marked_alive

from specparity.serving.child import reaper
from specparity.serving.live.server import (
    LaunchedServer,
    ServerClient,
    ServerError,
    free_port,
    is_loopback,
    redact,
)

# a server with a child of its own (as vLLM's API server has its engine core), answering /health after a delay
SERVER = textwrap.dedent("""
    import http.server, subprocess, sys, time
    delay, mode = float(sys.argv[2]), sys.argv[3]
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a grandchild, as an engine core
    if mode == "die":
        print("engine: cannot load the model", flush=True); sys.exit(7)
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and mode != "mute"
            self.send_response(200 if ok else 404); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    p = tmp_path / "srv.py"
    p.write_text(SERVER)
    return p


def _server(script: Path, mode: str = "ok", delay: float = 0.3) -> LaunchedServer:
    port = free_port()
    return LaunchedServer([sys.executable, str(script), str(port), str(delay), mode], {}, f"http://127.0.0.1:{port}")


def test_a_launched_server_answers_and_its_whole_tree_stops(server_script: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv(reaper.MARKER_ENV, marker := f"t-up-{os.getpid()}")
    with _server(server_script) as srv:
        srv.wait_healthy(30)
        assert srv.started_s is not None and srv.started_s < 30
        assert len(marked_alive(marker)) == 2  # the server and its own child
        with ServerClient(srv.url) as c:
            assert c.healthy()
            with pytest.raises(ServerError) as e:
                c.text("/nothing")
            assert e.value.status == 404
        log = srv.log
    assert gone(marker)
    assert log is not None and not log.parent.exists()  # the server's own directory is removed


def test_a_server_that_dies_names_its_log(server_script: Path) -> None:
    with _server(server_script, mode="die") as srv, pytest.raises(ServerError) as e:
        srv.wait_healthy(30)
    assert "exited with code 7" in str(e.value) and "cannot load the model" in str(e.value)


def test_a_server_that_never_answers_times_out(server_script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reaper.MARKER_ENV, marker := f"t-mute-{os.getpid()}")
    with _server(server_script, mode="mute") as srv, pytest.raises(ServerError) as e:
        srv.wait_healthy(2)
    assert "did not answer /health within 2 s" in str(e.value)
    assert gone(marker)


def test_an_unreachable_server_is_a_server_error() -> None:
    with ServerClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as c, pytest.raises(ServerError) as e:
        c.get_json("/server_info")
    assert e.value.status is None and "ConnectError" in str(e.value)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_nothing_is_left_when_the_gate_is_killed_or_interrupted(server_script: Path, tmp_path: Path,
                                                               how: signal.Signals) -> None:
    """A process holding a launched server (as the gate does) is killed with SIGKILL (no handler runs: the watchdog
    stops the tree and removes the directory) or sent SIGTERM/SIGINT (the finally blocks do)."""
    marker = f"t-{how.name}-{os.getpid()}"
    holder = tmp_path / "holder.py"
    holder.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = {sys.path!r}
        from specparity.serving.child import reaper
        from specparity.serving.live.server import LaunchedServer, free_port
        port = free_port()
        with reaper.signals_unwind():
            with LaunchedServer([sys.executable, {str(server_script)!r}, str(port), "0.1", "ok"], {{}},
                                f"http://127.0.0.1:{{port}}") as srv:
                srv.wait_healthy(30)
                print(srv.log.parent, flush=True)
                time.sleep(600)
    """))
    env = {**os.environ, reaper.MARKER_ENV: marker}
    # SIGINT as a terminal gives it (a background job, e.g. CI started with `&`, inherits it ignored: Python then
    # never raises KeyboardInterrupt; tests/faults/fault_runs.py does the same)
    proc = subprocess.Popen([sys.executable, str(holder)], env=env, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        workdir = Path(proc.stdout.readline().strip())
        assert workdir.is_dir()
        assert len(marked_alive(marker)) >= 3  # the holder, the server and its child
        proc.send_signal(how)
        proc.wait(timeout=30)
        assert gone(marker, within_s=15), marked_alive(marker)
        end = time.monotonic() + 10
        while workdir.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert not workdir.exists()
        if how is signal.SIGTERM:
            assert proc.returncode == 1  # Interrupted escaped the script: Python's own exit for an exception
    finally:
        if proc.poll() is None:
            proc.kill()


def test_loopback_and_redaction() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert redact(["--api-key", "s3cret", "--x=s3cret"], ["s3cret"]) == ["--api-key", "***", "--x=***"]
