"""Every registry class with an EAGLE-3 setter, resolved on the meta device by the installed family's static level.

The 0.5.23 counterpart is test_static_registry.py (in-process). Families A-D (0.4.4.post2-0.5.21) build the real
target and draft on the meta device with SGLang's own functions (serving/sglang/meta_build.py) and run the real
setter on that object, with no hand-built ``self``. registry_sweep.py runs the product's ``resolve``
on every class in one child process of this env's interpreter; each answer must be a layout equal to the
conventions module, or the version's pinned refusal (version_facts.VersionFacts.static_refusals), never a crash
of specparity's own harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from static_configs import TARGETS
from version_facts import SGLANG_VERSION, installed_facts, require_sglang

from specparity.idrules import sglang
from specparity.serving.results import NEEDS_HARDWARE, SGLANG_EXCEPTION, UNSUPPORTED_VERSION

pytestmark = pytest.mark.sglang
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

if SGLANG_VERSION == "0.5.23":
    pytest.skip("sglang 0.5.23's static level is test_static_registry.py's (in-process)", allow_module_level=True)


@cache
def sweep() -> dict[str, dict[str, Any]]:
    require_sglang()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    proc = subprocess.run([sys.executable, str(HERE / "registry_sweep.py")], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, f"registry_sweep.py exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_every_class_with_a_setter_has_a_config_and_resolves_or_is_a_pinned_refusal() -> None:
    results = sweep()
    assert results, "the installed SGLang's registry has no class with an EAGLE-3 setter"
    facts = installed_facts()
    problems: list[str] = []
    for arch, r in sorted(results.items()):
        expected = facts.static_refusals.get(arch)
        if r["kind"] == "resolved":
            if expected is not None:
                problems.append(f"{arch}: resolved, but sglang {SGLANG_VERSION} is pinned to refuse it ({expected})")
                continue
            plan = sglang.capture_plan(r["ids"], num_layers=r["num_layers"], architecture=arch,
                                       version=str(SGLANG_VERSION))
            if r["architecture"] != arch or tuple(r["layers_to_capture"]) != plan.layers_to_capture \
                    or tuple(r["served_sources"]) != plan.served_sources:
                problems.append(f"{arch}: SGLang's setter on the meta-built object stored {r['layers_to_capture']} "
                                f"({r['served_sources']}); the conventions module says {list(plan.layers_to_capture)}")
        elif expected is None:
            problems.append(f"{arch}: {r['kind']}: {r.get('message', '')}")
        else:
            kind, quote = expected
            if r["kind"] != kind or quote not in r["message"]:
                problems.append(f"{arch}: expected {kind} quoting {quote!r}, got {r['kind']}: {r.get('message')}")
    assert not problems, "\n".join(problems)


def test_no_answer_is_a_crash_of_specparitys_own_harness() -> None:
    # a failure is SGLang's own exception or GPU query (quoting its file:line), or a named gap of the meta-device
    # build; never an exception of specparity's own adapter code
    for arch, r in sweep().items():
        if r["kind"] == UNSUPPORTED_VERSION:
            assert "meta device" in r["message"] and "sglang/srt/" in r["message"], (arch, r)
        elif r["kind"] == SGLANG_EXCEPTION:
            assert " at sglang/srt/" in r["message"] and "specparity/serving" not in r["message"], (arch, r)
        elif r["kind"] == NEEDS_HARDWARE:
            assert "SGLang asks for a GPU at sglang/srt/" in r["message"], (arch, r)
        else:
            assert r["kind"] in ("resolved", "no_config"), (arch, r)


def test_wrappers_that_delegate_are_resolved_through_their_own_setter() -> None:
    # Llama-4's multimodal wrapper delegates to its language model (0.5.3 models/mllama4.py); a hand-built
    # setter object could never answer it. Family A's 0.4.8 registers no wrapper with a setter.
    results = sweep()
    if Version(str(SGLANG_VERSION)) < Version("0.4.10"):
        assert "Llama4ForConditionalGeneration" not in results, results
        assert {r["capture_owner"] for r in results.values() if r["kind"] == "resolved"} == {"model"}, results
        return
    r = results.get("Llama4ForConditionalGeneration")
    assert r is not None, f"sglang {SGLANG_VERSION}: Llama4ForConditionalGeneration is not in the registry sweep"
    assert r["kind"] == "resolved" and r["capture_owner"] == "language_model.model", r


def test_stand_ins_written_here_are_named_with_their_fields() -> None:
    # a result that rests on a file written in place of a checkpoint's (the Ling/Sarvam remote-code
    # module, static_configs.stand_ins) names it and the config fields it assumes; a release without SGLang's class
    # says that no stand-in is written and the architecture goes unchecked
    for arch, r in sorted(sweep().items()):
        remote = TARGETS.get(arch, ("", {}))[0].startswith("remote:")
        if r["kind"] == "no_config":
            assert not remote or "no stand-in is written" in r["message"], (arch, r)
            continue
        named = r["stand_ins"]
        assert bool(named) is remote, (arch, named)
        assert all(n["file"] and n["stands_in_for"] and n["provides"] and n["fields_assumed"] for n in named), named
