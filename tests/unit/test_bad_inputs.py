"""Exit codes that tell the truth: every bad file the user gave is exit 2 naming the file and the
field, found before any engine starts; an engine that cannot even be imported is exit 3; a limit of specparity's own
replay is named as ours. The cases are tests/bad_inputs.py's tables, which a fault tier walks too.

The gate runs in-process with the engine replaced by one that fails the test if it is asked to start.
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from tests.bad_inputs import (
    BAD_CONTRACTS,
    BAD_DRAFTS,
    BUNDLE,
    CONTRACT,
    contract_copy,
    draft_copy,
    named_file,
    torch_bin,
    tripwire_marker,
)

import specparity.gate
from specparity.checkpoint_files import checkpoint_shapes
from specparity.cli import main
from specparity.contract import load_contract, parse_contract, read_contract_probes
from specparity.errors import InputError


class _NoStart:
    """The real engine for everything before its start; starting it fails the test."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name in ("resolve", "capture", "explain"):
            raise AssertionError(f"the engine's {name} ran: bad input must be refused before any engine starts")
        return getattr(self._engine, name)


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import specparity.serving.engine as engine

    real = engine.get_engine
    monkeypatch.setattr(specparity.gate, "get_engine", lambda name: _NoStart(real(name)))
    monkeypatch.setattr(engine, "get_engine", lambda name: _NoStart(real(name)))
    yield


def gate(*args: str, contract: Path = CONTRACT, target: Path = BUNDLE / "target", draft: Path = BUNDLE / "draft",
         level: str = "static") -> Any:
    return CliRunner().invoke(main, ["gate", "--contract", str(contract), "--target", str(target), "--draft",
                                     str(draft), "--level", level, *args])


# --- the draft's weights ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["static", "capture"])
@pytest.mark.parametrize("case", sorted(BAD_DRAFTS))
def test_a_broken_draft_checkpoint_is_exit_2_naming_the_file(tmp_path: Path, case: str, level: str,
                                                             no_engine: None) -> None:
    bad = BAD_DRAFTS[case]
    draft = bad.build(tmp_path / "draft")
    before = {p.name: p.read_bytes() for p in draft.iterdir() if p.is_file() and not p.is_symlink()}
    result = gate(draft=draft, level=level)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"specparity: error: {draft / bad.file}: --draft: "), line
    assert bad.says in line and "Traceback" not in result.output
    assert "weights_only=False" not in line and "will likely succeed" not in line
    assert not tripwire_marker(draft).exists()  # no pickle ran
    assert before == {p.name: p.read_bytes() for p in draft.iterdir() if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("case", sorted(BAD_DRAFTS))
def test_explain_refuses_the_same_files_before_the_engine(tmp_path: Path, case: str, no_engine: None) -> None:
    bad = BAD_DRAFTS[case]
    draft = bad.build(tmp_path / "draft")
    result = CliRunner().invoke(main, ["explain", "--target", str(BUNDLE / "target"), "--draft", str(draft)])
    assert result.exit_code == 2 and f"{draft / bad.file}: --draft: " in result.output, result.output


@pytest.mark.parametrize("case", sorted(BAD_DRAFTS))
def test_the_engine_child_names_the_file_too(tmp_path: Path, case: str) -> None:
    """What the child reads (the checkpoint's fc shape) raises the same InputError, never struct.error or torch's
    advice, for anyone who reaches it without the gate's check."""
    bad = BAD_DRAFTS[case]
    draft = bad.build(tmp_path / "draft")
    with pytest.raises(InputError) as e:
        checkpoint_shapes(draft)
    assert e.value.path == str(draft / bad.file) and "weights_only=False" not in str(e.value)
    assert not tripwire_marker(draft).exists()


def test_a_plain_torch_state_dict_draft_passes_the_check(tmp_path: Path) -> None:
    from specparity.deployed import check_deployed_files

    draft = torch_bin(tmp_path / "draft")
    check_deployed_files(BUNDLE / "target", draft)
    assert checkpoint_shapes(draft)["fc.weight"] == (64, 192)


def test_a_broken_target_checkpoint_names_target(tmp_path: Path, no_engine: None) -> None:
    import shutil

    target = Path(shutil.copytree(BUNDLE / "target", tmp_path / "target"))
    (target / "model.safetensors").write_bytes(b"")
    result = gate(target=target)
    assert result.exit_code == 2 and f"{target / 'model.safetensors'}: --target: 0 bytes" in result.output


def test_swapped_target_and_draft_are_named_as_swapped(no_engine: None) -> None:
    result = gate(target=BUNDLE / "draft", draft=BUNDLE / "target")
    assert result.exit_code == 2, result.output
    assert (f"{BUNDLE / 'draft'}: --target: is an EAGLE drafter (architectures LlamaForCausalLMEagle3), not a target "
            f"model; {BUNDLE / 'target'} is the target: --target and --draft are swapped") in result.output


# --- the contract and its probe pack -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD_CONTRACTS))
def test_a_bad_contract_or_probe_pack_is_exit_2_before_the_engine(tmp_path: Path, case: str,
                                                                  no_engine: None) -> None:
    bad = BAD_CONTRACTS[case]
    contract = bad.build(tmp_path / "c")
    level = "capture" if bad.file == "probes" else "all"
    result = gate(contract=contract, level=level)
    assert result.exit_code == 2, result.output
    assert f"{named_file(contract, bad.file)}: {bad.field}: " in result.output and bad.says in result.output
    validate = CliRunner().invoke(main, ["contract", "validate", str(contract)])
    assert validate.exit_code == 2 and f"{bad.field}: " in validate.output, validate.output


def test_probe_ids_outside_the_vocabulary_and_shapes_are_refused(tmp_path: Path) -> None:
    from tests.bad_inputs import _rewrite_pack

    def big_id(samples: list[dict[str, torch.Tensor]]) -> None:
        ids = samples[0]["input_ids"].clone()
        ids[0] = 512
        samples[0]["input_ids"] = ids

    contract = _rewrite_pack(contract_copy(tmp_path / "ids"), big_id)
    with pytest.raises(InputError) as e:
        read_contract_probes(load_contract(contract), contract)
    assert e.value.field == "sample_0.input_ids" and "target.vocab_size 512" in str(e.value)

    def short_mask(samples: list[dict[str, torch.Tensor]]) -> None:
        samples[3]["loss_mask"] = samples[3]["loss_mask"][:-1]

    contract = _rewrite_pack(contract_copy(tmp_path / "mask"), short_mask)
    with pytest.raises(InputError) as e:
        read_contract_probes(load_contract(contract), contract)
    assert e.value.field == "sample_3.loss_mask"


@pytest.mark.parametrize(("where", "value"), [
    (("training_outcome", "expected_acceptance_length"), math.inf),
    (("tolerances", "default", "atol"), math.inf),
    (("training_outcome", "accuracy_per_position", 0), math.nan),
    (("training_outcome", "acceptance_per_position", 0), 1.5),
])
def test_every_contract_number_is_finite(where: tuple[Any, ...], value: float) -> None:
    data = json.loads(CONTRACT.read_text())
    data.pop("content_hash")
    node = data
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = value
    with pytest.raises(InputError) as e:
        parse_contract(data, path="c.json")
    assert e.value.field == ".".join(str(k) for k in where).replace(".0", "[0]")


def test_the_committed_schema_says_numbers_are_finite() -> None:
    schema = json.loads((CONTRACT.parent / "schema" / "contract.v1.schema.json").read_text())
    assert "finite" in schema["description"]
    rate = schema["$defs"]["TrainingOutcome"]["properties"]["acceptance_per_position"]["anyOf"][0]["items"]
    assert (rate["minimum"], rate["maximum"]) == (0, 1) and "finite" in rate["description"]


# --- the machine, and specparity's own limits ---------------------------------------------------------------------


def test_an_engine_that_cannot_be_imported_is_the_machine_not_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only HOME makes SGLang's import raise (its transformers patches make ~/.cache): exit 3, never 1."""
    import specparity.serving.sglang.adapter as adapter
    from specparity.compare.findings import status_of
    from specparity.serving.sglang import worker
    from specparity.verdict import rules

    def load_adapter(*args: Any, **kw: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system", "/home/ci/.cache")

    monkeypatch.setattr(adapter, "load_adapter", load_adapter)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    failure = worker.prepare("cuda").failure  # cuda: no CPU stand-in is put on this process's sys.path
    assert failure.kind == "engine_import" and "Read-only file system: '/home/ci/.cache'" in failure.message
    assert rules.failure_cause(failure.kind, failure.message) == "environment"
    [finding] = rules.serving_findings([failure], engine="sglang", version="0.5.23")
    assert status_of([finding]) == "error" and "writable HOME" in str(finding.fix)


def test_a_replay_limit_is_named_as_ours_never_the_engines(tmp_path: Path) -> None:
    from specparity.compare.findings import status_of
    from specparity.replay.outcome import check_outcome
    from specparity.report.terminal import fix_text, summary_line
    from specparity.serving.results import CaptureResult, FcCapture

    draft = torch_bin(tmp_path / "draft")
    contract = load_contract(CONTRACT)
    pack = read_contract_probes(contract, CONTRACT)
    fc = FcCapture(per_sample=[s.fc_input for s in pack.samples], dtype="float32", engine_version="0.5.23",
                   hook_calls=4, aux_states_captured=3, aux_states_expected=3, kernel_stub_calls=())
    out = check_outcome(contract, pack, CaptureResult(None, fc, None, ()), target=BUNDLE / "target", draft=draft,
                        engine="SGLang")
    [finding] = [f for f in out.findings if f.details.get("cause") == "specparity"]
    assert finding.is_failure and status_of([finding]) == "error"
    assert "a limit of specparity, not of SGLang or the deployment" in finding.message
    verdict = _verdict_with(finding)
    assert summary_line(verdict).endswith("a limit of specparity (training-side replay), not SGLang's")
    assert "SGLang failed" not in summary_line(verdict) and "--level capture" in fix_text(verdict)


def _verdict_with(*findings: Any) -> Any:
    from specparity.compare.findings import status_of
    from specparity.verdict import Verdict

    return Verdict(contract_name="tiny-llama-eagle3", contract_hash=None, level="all",
                   status=status_of(findings),  # type: ignore[arg-type]
                   engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="d",
                   expected_layout=["layer:1"], served_layout=["layer:1"], findings=findings)


def test_inputs_are_never_modified(tmp_path: Path, no_engine: None) -> None:
    draft = draft_copy(tmp_path / "draft")
    contract = contract_copy(tmp_path / "c")
    before = {p: p.read_bytes() for p in [*draft.iterdir(), *contract.parent.iterdir()]}
    (draft / "model.safetensors").write_bytes(b"")
    before[draft / "model.safetensors"] = b""
    assert gate(contract=contract, draft=draft).exit_code == 2
    assert before == {p: p.read_bytes() for p in [*draft.iterdir(), *contract.parent.iterdir()]}
