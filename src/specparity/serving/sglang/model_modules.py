"""Which of SGLang's model modules a static resolution imports (time on 2 cores).

SGLang's model registry imports every module of ``sglang.srt.models`` when it is first imported (sglang
0.5.23 ``models/registry.py:153-159`` -> ``import_model_classes`` ``:117-150``, about 250 modules; 3.9 s of
the 61-layer resolution on 2 cores, measured with ``-X importtime``), although a meta build looks up two
classes: the target's and the draft's. SGLang's own switch ``SGLANG_DISABLED_MODEL_ARCHS``
(``environ.py:294``, read at ``registry.py:123``) skips modules by name.

Which module holds an architecture is what SGLang's full registry said on an earlier full import in the
same installation (cached per install, keyed by the models folder's file names and times), never read
from source. The registry's lookup code runs unchanged on the smaller registry. Anything that differs from
what the full registry would give (an architecture the smaller registry lacks, SGLang rewriting the
architecture, a class from a module outside the set) is caught by :func:`ensure_full_registry` /
:func:`class_from_subset`, and the model is built again from the full registry. A child forked from a
warm-start zygote (serving/child/warm.py) already has the whole registry (child_setup.PRELOAD): nothing is limited there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

Model = TypeVar("Model")

ENV = "SGLANG_DISABLED_MODEL_ARCHS"
_PACKAGE = "sglang.srt.models"
_ENABLED: frozenset[str] | None = None  # the modules this process let SGLang's registry import (None: all)


def _models_dir() -> Path | None:
    spec = importlib.util.find_spec("sglang")  # finds, does not import
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "srt" / "models"
    return d if d.is_dir() else None


def _modules(models_dir: Path) -> list[str]:
    return sorted(p.stem for p in models_dir.glob("*.py") if p.stem != "__init__")


def _cache_file(models_dir: Path) -> Path:
    h = hashlib.sha256(str(models_dir.resolve()).encode())
    for p in sorted(models_dir.glob("*.py")):
        h.update(f"{p.name}\0{p.stat().st_mtime_ns}\0".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "specparity" / f"sglang-model-modules-{h.hexdigest()[:16]}.json"


def _read_map(path: Path) -> dict[str, str] | None:
    """The cached map, or None when it is missing or not a map of names (a torn or hand-edited file)."""
    try:
        where = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(where, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in where.items()):
        return None
    return where


def limit_registry(architectures: Iterable[str]) -> frozenset[str] | None:
    """Before SGLang's registry is imported: let it import only the modules holding ``architectures``.

    Returns the enabled module names, or None (full registry) when the registry is already imported in
    this process, no map of this installation is cached yet, or an architecture is not in the map.
    """
    global _ENABLED
    models_dir = _models_dir()
    if models_dir is None or f"{_PACKAGE}.registry" in sys.modules or os.environ.get(ENV):
        return None
    where = _read_map(_cache_file(models_dir))
    if where is None:
        return None
    wanted = list(architectures)
    if not wanted or any(a not in where for a in wanted):
        return None
    enabled = frozenset(where[a] for a in wanted)
    os.environ[ENV] = ",".join(m for m in _modules(models_dir) if m not in enabled)
    _ENABLED = enabled
    return enabled


def record_full_registry() -> None:
    """After a full registry import: cache architecture -> module as SGLang's registry reports it."""
    if _ENABLED is not None:
        return
    from sglang.srt.models.registry import ModelRegistry

    models_dir = _models_dir()
    # the name carries the installation's stamp; a file there that is no map (corrupt) is written again
    if models_dir is None or _read_map(_cache_file(models_dir)) is not None:
        return
    where = {arch: cls.__module__.rsplit(".", 1)[1] for arch, cls in ModelRegistry.models.items()
             if isinstance(cls, type) and cls.__module__.startswith(f"{_PACKAGE}.")}
    path = _cache_file(models_dir)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as fh:
            tmp = fh.name
            json.dump(where, fh, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:  # a full disk: no torn temporary file left beside the cache
            Path(tmp).unlink(missing_ok=True)
        # no writable cache: every resolution imports the full registry, as SGLang does


def class_from_subset(model: object) -> bool:
    """Whether ``model`` was built while the registry held only a subset, and its class is from that subset."""
    module = type(model).__module__
    return _ENABLED is not None and module.startswith(f"{_PACKAGE}.") and module.rsplit(".", 1)[1] in _ENABLED


def ensure_full_registry() -> bool:
    """Give SGLang's registry every model module (its own ``ModelRegistry.register``), if it had a subset.

    Returns True when it had to (the caller then builds again).
    """
    global _ENABLED
    if _ENABLED is None:
        return False
    from sglang.srt.models.registry import ModelRegistry, import_model_classes

    os.environ.pop(ENV, None)
    import_model_classes.cache_clear()  # lru_cache'd on the package name (registry.py:117)
    ModelRegistry.register(_PACKAGE, overwrite=True)
    _ENABLED = None
    return True


def subset_in_use() -> bool:
    """Whether this process's registry holds a subset of SGLang's model modules."""
    return _ENABLED is not None


def architectures(*model_dirs: str) -> list[str]:
    """``architectures`` of each model directory's config.json (what SGLang's registry will look up)."""
    out: list[str] = []
    for d in model_dirs:
        try:
            out += [str(a) for a in json.loads((Path(d) / "config.json").read_text()).get("architectures") or []]
        except (OSError, ValueError, AttributeError):
            return []  # unreadable here: SGLang reports it, with the full registry
    return out


def build_as_full_registry(build: Callable[..., Model], model_config: Any, *, server_args: Any) -> Model:
    """``build(model_config, server_args=...)``, giving the class SGLang's full registry gives.

    On a limited registry, a failure or a class from another module (SGLang rewrote the architecture,
    model_loader/utils.py:198-240) builds again from the full registry, whose answer (or error) stands;
    without a limit it builds once and records this installation's architecture -> module map.
    """
    if not subset_in_use():
        model = build(model_config, server_args=server_args)
        record_full_registry()
        return model
    try:
        model = build(model_config, server_args=server_args)
        if class_from_subset(model):
            return model
    except Exception:
        pass
    ensure_full_registry()
    return build(model_config, server_args=server_args)
