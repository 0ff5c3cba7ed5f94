"""Which releases accept a flag the installed engine rejects (specparity.serving.flag_history), from the committed
data scripts/flag_history.py built from the engines' release wheels. No engine here: tests/serving and
tests/vllm_engine check the message on published commands the installed releases reject."""

from __future__ import annotations

import re

import pytest

from specparity.serving import flag_history as fh


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_data_says_where_it_came_from_and_holds_together(engine: str) -> None:
    data = fh.load()
    assert "scripts/flag_history.py" in data["source"]
    history = data[engine]
    releases = history["releases"]
    assert releases == sorted(releases, key=_key) and len(releases) >= 20
    assert set(history["read_by"]) >= set(releases)
    for flag, runs in history["flags"].items():
        assert flag.startswith("-") and runs
        for first, last in runs:
            assert first in releases and last in releases and _key(first) <= _key(last)


def test_sglangs_split_cuda_graph_flag() -> None:
    """SGLang's docs' --cuda-graph-max-bs: a flag until the split into -decode/-prefill, ambiguous after."""
    found = fh.accepting("sglang", "--cuda-graph-max-bs")
    assert ("0.5.3", None) in found and all(full is None for _, full in found)
    assert "0.5.23" not in [r for r, _ in found]
    note = fh.history_notes("sglang", "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
                            "--cuda-graph-max-bs-prefill", "--cuda-graph-max-bs", installed="0.5.23")
    assert re.search(r"--cuda-graph-max-bs is a flag of SGLang 0\.4\.0-0\.5\.\d+ ", note)
    assert "--python" in note and "SGLang 0.5.23 is what parsed here" in note


def test_an_abbreviation_older_releases_read_as_one_flag() -> None:
    """SafeAILab/EAGLE#173's --speculative-draft: the abbreviation of one flag before SGLang added its siblings."""
    note = fh.history_notes("sglang", "ambiguous option: --speculative-draft could match "
                            "--speculative-draft-model-path, --speculative-draft-model-revision", "--speculative-draft",
                            installed="0.5.23")
    assert "--speculative-draft is the abbreviation of --speculative-draft-model-path in SGLang 0.4." in note


def test_every_flag_an_unrecognized_list_names() -> None:
    msg = "unrecognized arguments: --nsa-decode-backend trtllm --nsa-prefill-backend trtllm --no-such-flag-at-all"
    assert fh.rejected_flags(msg, "--nsa-decode-backend") == ["--nsa-decode-backend", "--nsa-prefill-backend",
                                                              "--no-such-flag-at-all"]
    note = fh.history_notes("sglang", msg, "--nsa-decode-backend", installed="0.5.23")
    assert "--nsa-decode-backend is a flag of SGLang" in note and "--nsa-prefill-backend is a flag of" in note
    assert "--no-such-flag-at-all" not in note


def test_vllms_spellings_and_its_removed_speculative_model() -> None:
    """vllm#7456's --speculative-model (gone from vLLM's parser), also as --speculative_model (vLLM reads _ as -)."""
    found = fh.accepting("vllm", "--speculative_model")
    assert found and found == fh.accepting("vllm", "--speculative-model") and "0.32.0" not in [r for r, _ in found]
    note = fh.history_notes("vllm", "unrecognized arguments: --speculative-model /m", "--speculative-model",
                            installed="0.32.0")
    assert "--speculative-model is a flag of vLLM 0.5.5" in note and "--python" in note


@pytest.mark.parametrize(("message", "flag"), [
    ("argument --attention-backend: invalid choice: 'fa99'", "--attention-backend"),
    ("unrecognized arguments: --never-a-flag 1", "--never-a-flag"),
    ("the following arguments are required: --model-path", "--model-path"),
])
def test_no_note_where_history_has_nothing_to_add(message: str, flag: str) -> None:
    assert fh.history_notes("sglang", message, flag, installed="0.5.23") == ""
