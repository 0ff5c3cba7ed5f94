"""The interface every serving engine implements, and the base both implementations extend.

Apart from the registry (``serving/engine.py``: ``get_engine``), so that each engine's room
(``serving/sglang/engine.py``, ``serving/vllm/engine.py``) imports this and the registry imports the rooms,
one way. Every method returns typed results (:class:`ResolvedDeployment`, :class:`CaptureResult`,
:class:`ServingFailure`, :class:`Explanation`) in canonical source names.

- ``spec_args``: the contract's speculative settings in the engine's own spelling.
- ``resolve``: static resolution with the engine's own code, no forward.
- ``capture``: one engine start per gate run: the fc input per probe and the target's residual stream at every
  boundary; given an :class:`OutcomeRequest`, also the outcome evidence of that same run, typed on the
  :class:`CaptureResult`: the engine's own drafter on served and recorded inputs (SGLang, ``replay``: its replay
  hooks, ``serving/drafter_replay.py``) and the acceptance its real serving loop counted (vLLM, ``acceptance``).
- ``reading`` and ``layout_fix``: the engine's id conventions (``specparity.idrules.<engine>``): which ids it reads
  from a draft config and what they mean there, and the draft-config patch that makes it serve given sources.
- ``explain``: ``specparity explain``: what the engine will feed fc, and how it got there. No contract.
- ``versions`` and ``versions_lines``: the releases it supports (``specparity versions``, JSON and terminal).
- the live check (``serving/live/capture.py``), on the user's own server: ``live_switches`` (what the gate adds to the
  user's command: the engine's own hook switches), ``live_capture`` (the probes through the running server, the
  evidence through the engine's channel, the outcome from its own counters), ``live_resolve`` (the static level
  from what a running server reports), ``server_failure`` (a server that did not come up, read from its log),
  ``health_path`` and ``launch_flags`` (what ``specparity launch-flags`` prints for a staging server);
  ``dev_endpoints`` (what a running server exposes beyond serving that the gate would use: vLLM's dev mode), which
  the gate refuses to use on a non-loopback URL without ``--allow-dev-endpoints``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from specparity.compare.fix import DraftConfigFix
    from specparity.deploy_command import LaunchCommand
    from specparity.serving.live.server import ServerClient
    from specparity.serving.results import (
        CaptureResult,
        Explanation,
        IdReading,
        OutcomeRequest,
        Progress,
        ResolvedDeployment,
        ServingFailure,
    )

__all__ = ["Engine", "EngineBase"]


class Engine(Protocol):
    """A serving engine adapter (module docstring)."""

    name: str
    label: str  # as reports spell it: "SGLang", "vLLM"

    def spec_args(self, num_steps: int | None, eagle_topk: int | None,
                  num_draft_tokens: int | None) -> dict[str, object]: ...

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> ResolvedDeployment | ServingFailure: ...

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: Progress | None, outcome: OutcomeRequest | None = None) -> CaptureResult: ...

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> IdReading | None: ...

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix: ...

    def explain(self, target: Path, draft: Path, *, args: Mapping[str, object], python: str | None,
                timeout_s: float) -> Explanation: ...

    def versions(self) -> list[dict[str, Any]]: ...

    def versions_lines(self) -> list[str]: ...

    health_path: str

    def live_switches(self, command: LaunchCommand, *, evidence_dir: Path,
                      program: Sequence[str] = ()) -> tuple[list[str], dict[str, str], list[str]]: ...

    def live_capture(self, client: ServerClient, *, evidence_dir: Path | None, probes: Sequence[Sequence[int]],
                     outcome: OutcomeRequest | None, progress: Progress | None,
                     cwd: str | None) -> CaptureResult: ...

    def live_resolve(self, client: ServerClient, *, python: str | None,
                     timeout_s: float) -> ResolvedDeployment | ServingFailure: ...

    def server_failure(self, message: str, log_lines: Sequence[str]) -> ServingFailure: ...

    def launch_flags(self) -> tuple[list[str], dict[str, str], list[str]]: ...

    def dev_endpoints(self, client: ServerClient) -> str | None: ...


class EngineBase:
    """What the two engine adapters share: :meth:`Engine.spec_args` read off a table of the engine's keywords."""

    name: str
    label: str
    # the engine's keywords for the contract's num_steps, eagle_topk and num_draft_tokens; None: it takes none
    spec_keys: tuple[str | None, str | None, str | None]

    def spec_args(self, num_steps: int | None, eagle_topk: int | None,
                  num_draft_tokens: int | None) -> dict[str, object]:
        values = (num_steps, eagle_topk, num_draft_tokens)
        return {k: v for k, v in zip(self.spec_keys, values, strict=True) if k is not None and v is not None}

    def dev_endpoints(self, client: ServerClient) -> str | None:
        """What the running server at ``client`` exposes beyond serving that the gate would use (a sentence), or
        None: an engine without dev-mode endpoints."""
        return None
