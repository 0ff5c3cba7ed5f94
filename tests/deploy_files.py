"""Files of a user's deploy repo, as the plugin's tests and benchmarks/bench_startup.py write them.

``pyproject_with_deployments`` renders ``[tool.specparity.deployments.<name>]`` tables (TOML, as a user writes
them) after a pytest ini table that turns the cache provider off; ``draft_with_ids`` copies a drafter with other
``eagle_aux_hidden_state_layer_ids`` (the seed incident's [-1, 1, 3], a layer-late copy).

Imported as ``tests.deploy_files`` (the checkout's root is on sys.path: pytest puts the root conftest.py's
folder there; the benchmark adds it itself).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

NO_CACHE = '[tool.pytest.ini_options]\naddopts = "-p no:cacheprovider"\n'


def toml_value(value: object) -> str:
    """One TOML value: strings (and paths) quoted, lists as arrays, mappings as inline tables."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: the same escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def pyproject_with_deployments(deployments: Mapping[str, Mapping[str, object]]) -> str:
    """A pyproject.toml: the ini table, then one deployment table per name, its keys in the order given."""
    tables = [f"[tool.specparity.deployments.{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())
              for name, keys in deployments.items()]
    return "\n".join([NO_CACHE, *tables])


def draft_with_ids(source: Path, dest: Path, ids: list[int]) -> Path:
    """A copy of the drafter at ``source`` whose config.json names ``ids`` as its aux hidden-state layers."""
    shutil.copytree(source, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest
