"""Did SGLang load the whole target checkpoint? Measured around the target's own ``load_weights``.

SGLang builds the target's modules from its config and fills them in the model class's ``load_weights``, which
skips a checkpoint tensor it has no parameter for and leaves a parameter no tensor reaches as it was built
(``torch.empty`` memory); nothing in SGLang says so. 0.5.23's Qwen3-MoE builds every layer sparse and ignores
``mlp_only_layers`` (``models/qwen3_moe.py:873-886``, "all layers are sparse"), so a checkpoint with a dense first
layer loads without a word: its layer-0 MLP tensors are skipped (``:1224-1225`` and ``:1266-1267``, ``if name not in
params_dict: continue``) and that layer's experts are never loaded. The gate then saw only other hidden states and
blamed the target (``target_mismatch``) for the very checkpoint training used.

:func:`watch_target_load` measures it on the engine's own load, never re-implementing it. It wraps
``model_loader.loader._initialize_model`` (0.5.23 ``loader.py:285``; 0.5.14 ``:297``, 0.5.20 ``:277``), which every
loader calls to build the model before it calls ``model.load_weights(weights)`` (the default loader, 0.5.23
``loader.py:1013-1021`` -> ``:1063``), and wraps the *target* instance's ``load_weights`` (the draft's model config
has ``is_draft_model``, ``configs/model_config.py:596``). Around SGLang's own call:

- before it, every floating-point parameter is filled with a sentinel NaN (its own bit pattern, which neither a
  checkpoint NaN nor a dtype conversion produces) and its value kept on the CPU;
- the weights iterator SGLang hands over is wrapped: the checkpoint tensor names it was given, in order, and for
  each one whether a weight loader ran while ``load_weights`` held it (every parameter's ``weight_loader``, set by
  ``set_weight_attrs``, ``utils/common.py:2673``, and the model modules' ``default_weight_loader``, wrapped for the
  call only);
- after it, a parameter that still holds the sentinel everywhere was never loaded (tied weights share storage, so
  they count as loaded when either is; buffers are not parameters and are not checked). Every sentinel element is
  put back to the value the engine built, so the served model is exactly SGLang's.

The skipped checkpoint tensors are named only where that can be said exactly: every parameter that was loaded
went through a wrapped weight loader. A tensor a model holds back to fuse with a later one would be listed too;
none of the classes measured does that. Runs only inside the child process (it imports torch and, when called,
sglang).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from specparity.serving.sglang.setter_source import relative_file

# dtype -> (integer view, sentinel bits): a NaN with a payload no conversion of a checkpoint's NaN writes (a float32 or
# float64 NaN made from a narrower one has zero low bits; a bfloat16 NaN made from a wider one is quiet, this one not)
_SENTINELS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7FC05EED),
    torch.float64: (torch.int64, 0x7FF805EED05EED05),
    torch.bfloat16: (torch.int16, 0x7FA5),
    torch.float16: (torch.int16, 0x7E5D),
}
NAMES_KEPT = 12  # names listed per kind in the record; the counts are whole


def where_defined(obj: Any) -> str:
    """``sglang/srt/models/qwen3_moe.py:1157``: where a function or class of the installed engine is defined."""
    target = inspect.unwrap(obj) if callable(obj) and not inspect.isclass(obj) else obj
    try:
        path = inspect.getsourcefile(target) or ""
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return "?"
    return f"{relative_file(path)}:{line}"


class _Turns:
    """The checkpoint tensors handed to ``load_weights`` and which of them a weight loader took."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.taken: set[int] = set()  # indices into names during whose turn a weight loader ran
        self.reached: set[int] = set()  # ids of the parameters a weight loader was called for

    def iterate(self, weights: Iterable[Any]) -> Iterator[Any]:
        for item in weights:
            self.names.append(str(item[0]))
            yield item

    def note(self, param: Any) -> None:
        if self.names:
            self.taken.add(len(self.names) - 1)
        self.reached.add(id(param))


def _counted(loader: Callable[..., Any], turns: _Turns, param: Any | None) -> Callable[..., Any]:
    @functools.wraps(loader)
    def counted(*args: Any, **kwargs: Any) -> Any:
        turns.note(param if param is not None else (args[0] if args else None))
        return loader(*args, **kwargs)

    return counted


def _wrap_loaders(params: list[torch.nn.Parameter], fn: Any, turns: _Turns) -> Callable[[], None]:
    """Count every weight loader call while SGLang's ``load_weights`` runs; returns the undo."""
    undo: list[Callable[[], None]] = []
    for p in params:
        # set_weight_attrs puts weight_loader on the instance (0.5.23 utils/common.py:2673); the vLLM-style parameters
        # keep it as _weight_loader behind a property (layers/parameter.py:103-107)
        attr = next((a for a in ("weight_loader", "_weight_loader") if callable(vars(p).get(a))), None)
        if attr is None:
            continue
        original = vars(p)[attr]
        setattr(p, attr, _counted(original, turns, p))
        undo.append(functools.partial(setattr, p, attr, original))
    # a parameter without one gets default_weight_loader, named in the model module (0.5.23 models/qwen3_moe.py:1271-1273)
    # (imported by then: the model module imports it; looked up, not imported, so a plain module can be measured too)
    default = getattr(sys.modules.get("sglang.srt.model_loader.weight_utils"), "default_weight_loader", None)
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("sglang.srt.models.") and m is not None]
    holders = [vars(m) for m in modules] + [getattr(fn, "__globals__", {})]
    for g in holders if default is not None else ():
        if g.get("default_weight_loader") is default:
            g["default_weight_loader"] = _counted(default, turns, None)
            undo.append(functools.partial(g.__setitem__, "default_weight_loader", default))

    def restore() -> None:
        for u in reversed(undo):
            u()

    return restore


def _owning_modules(model: torch.nn.Module, never: set[str], params: dict[str, torch.nn.Parameter]) -> list[str]:
    """The modules whose every parameter was never loaded, outermost, each as ``path (Class, file:line)``."""
    def all_unloaded(path: str) -> bool:
        prefix = f"{path}." if path else ""
        names = [n for n in params if n.startswith(prefix)]
        return bool(names) and all(n in never for n in names)

    tops: list[str] = []
    for name in sorted(never):
        path = name.rpartition(".")[0]
        while True:  # climb while the parent holds nothing but never-loaded parameters (never to the model itself)
            parent = path.rpartition(".")[0]
            if not parent or not all_unloaded(parent):
                break
            path = parent
        if path not in tops:
            tops.append(path)
    out = []
    for path in tops:
        try:
            cls = type(model.get_submodule(path))
        except AttributeError:
            out.append(path)
            continue
        whole = all_unloaded(path)
        out.append(f"{path} ({cls.__name__}, {where_defined(cls)}{'' if whole else '; partly'})")
    return out


class TargetLoadWatch:
    """The target's load, measured: :attr:`record` is set once SGLang's ``load_weights`` returned."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.record: dict[str, Any] | None = None

    def instrument(self, model: torch.nn.Module) -> None:
        """Wrap this instance's ``load_weights`` (SGLang's own, called by its loader) for its first call."""
        original: Callable[..., Any] = getattr(model, "load_weights")  # noqa: B009 (nn.Module's typing)
        self.model = model

        @functools.wraps(original)
        def checked(weights: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
            vars(model).pop("load_weights", None)  # later calls (weight updates) are SGLang's own
            return self._measure(model, original, weights, *args, **kwargs)

        vars(model)["load_weights"] = checked  # the instance's, shadowing the class's for SGLang's one call

    def _measure(self, model: torch.nn.Module, original: Callable[..., Any], weights: Iterable[Any], *args: Any,
                 **kwargs: Any) -> Any:
        params = dict(model.named_parameters())  # one name per parameter object (tied ones once)
        checked = {n: p for n, p in params.items() if p.dtype in _SENTINELS}
        kept = {}
        for name, p in checked.items():
            view, bits = _SENTINELS[p.dtype]
            kept[name] = p.detach().to("cpu", copy=True)
            p.data.view(view).fill_(bits)
        turns = _Turns()
        fn = getattr(type(model), "load_weights", original)
        restore = _wrap_loaders(list(params.values()), fn, turns)
        try:
            result = original(turns.iterate(weights), *args, **kwargs)
        finally:
            restore()
            never, partly = self._restore(checked, kept)
        complete = all(id(p) in turns.reached for n, p in checked.items() if n not in never)
        skipped = [n for i, n in enumerate(turns.names) if i not in turns.taken] if complete else None
        self.record = {
            "engine_file_line": where_defined(fn),
            "function": f"{type(model).__name__}.load_weights",
            "parameters": len(params), "parameters_checked": len(checked),
            "checkpoint_tensors": len(turns.names),
            "never_loaded": sorted(never), "never_loaded_count": len(never),
            "modules": _owning_modules(model, set(never), params) if never else [],
            "partly_loaded_count": len(partly), "partly_loaded": sorted(partly)[:NAMES_KEPT],
            # None: cannot be said exactly (a parameter was loaded without a weight loader this watch saw)
            "skipped": None if skipped is None else skipped[:NAMES_KEPT],
            "skipped_count": None if skipped is None else len(skipped),
        }
        return result

    @staticmethod
    def _restore(checked: dict[str, torch.nn.Parameter], kept: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
        """Put back every sentinel element; return the parameters never loaded and those loaded only in part."""
        never, partly = [], []
        for name, p in checked.items():
            view, bits = _SENTINELS[p.dtype]
            left = p.data.view(view) == bits
            n = int(left.sum())
            if n == 0:
                continue
            before = kept[name].to(p.device)
            if n == left.numel():
                never.append(name)
                p.data.copy_(before)
            else:
                partly.append(name)
                p.data.view(view)[left] = before.view(view)[left]
        return never, partly


@contextmanager
def watch_target_load() -> Iterator[TargetLoadWatch]:
    """While open, the first non-draft model SGLang builds has its ``load_weights`` measured (:class:`TargetLoadWatch`)."""
    from sglang.srt.model_loader import loader

    watch = TargetLoadWatch()
    original = loader._initialize_model

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        config = args[0] if args else kwargs.get("model_config")
        if watch.model is None and not getattr(config, "is_draft_model", False) and hasattr(model, "load_weights"):
            watch.instrument(model)
        return model

    loader._initialize_model = initialize
    try:
        yield watch
    finally:
        loader._initialize_model = original
