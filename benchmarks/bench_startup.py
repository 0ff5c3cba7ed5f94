"""Benchmark: the time the specparity pytest plugin adds to a bare ``pytest --collect-only``.

A throwaway deploy repo: 50 ordinary tests and two deployments in pyproject.toml
(``[tool.specparity.deployments.<name>]``, the bundled contract), so that the plugin reads its
settings and builds its items as in real use. Each round runs, in fresh interpreters,
``pytest --collect-only -q`` without the plugin (``-p no:specparity``) and with it, alternately;
the figure is the median of each over the rounds, the difference and the ratio, in CPU time of the
child (what the plugin costs; steady on a shared machine) and in wall time (what a person waits).

Goal: the plugin adds at most 0.3 s (the plugin imports neither torch nor matplotlib nor an engine
before a parity item runs; tests/plugin/test_plugin.py checks that).
Run: ``.venv/bin/python benchmarks/bench_startup.py [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.deploy_files import pyproject_with_deployments  # noqa: E402

CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"
GOAL_S = 0.3

PYPROJECT = pyproject_with_deployments({
    "llama-a": {"contract": "contracts/tiny-llama-eagle3.json", "target": "models/target", "draft": "models/draft-a"},
    "llama-b": {"contract": "contracts/tiny-llama-eagle3.json", "target": "models/target", "draft": "models/draft-b",
                "engine_args": {"speculative_num_steps": 3}},
})


def _deploy_repo(root: Path) -> None:
    (root / "contracts").mkdir()
    shutil.copy(CONTRACT, root / "contracts" / CONTRACT.name)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "tests").mkdir()
    (root / "tests" / "test_app.py").write_text(
        "".join(f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(50)))


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(root: Path, *extra: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, pytest's last line)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))
    env.pop("PYTEST_ADDOPTS", None)
    c0, t0 = _cpu_children(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *extra], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - t0, _cpu_children() - c0
    if proc.returncode != 0:
        raise SystemExit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, cpu, proc.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specparity-startup-") as tmp:
        root = Path(tmp)
        _deploy_repo(root)
        _run(root)  # warm the file cache and byte-compile once
        bare: list[tuple[float, float]] = []
        plugin: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            *t, bare_line = _run(root, "-p", "no:specparity")
            bare.append((t[0], t[1]))
            *t, plugin_line = _run(root)
            plugin.append((t[0], t[1]))
    print(f"pytest --collect-only, median of {args.rounds} rounds in fresh interpreters:")
    print(f"  without the plugin  ({bare_line})")
    print(f"  with the plugin     ({plugin_line})")
    for i, what in ((1, "CPU time"), (0, "wall time")):
        b, p = statistics.median(x[i] for x in bare), statistics.median(x[i] for x in plugin)
        print(f"  {what:9}  without {b:.3f} s, with {p:.3f} s: plugin adds {p - b:+.3f} s (ratio {p / b:.2f}x)")
    b = statistics.median(x[1] for x in bare)
    added = statistics.median(x[1] for x in plugin) - b
    print(f"plugin adds {added:+.3f} s CPU to a bare pytest --collect-only ({(b + added) / b:.2f}x); "
          f"goal <= {GOAL_S} s: {'within' if added <= GOAL_S else 'OVER'}")

if __name__ == "__main__":
    main()
