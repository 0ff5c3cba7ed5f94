"""The target tokenizer's fingerprint: what maps text to token ids, not how the file happens to be written.

The contract records ``target.tokenizer_fingerprint`` and the gate compares it with the deployed target's
(compare/target.py). A sha256 over the file's bytes (what specparity recorded before this module) turns a
re-serialized tokenizer (other key order or indentation, or a re-save by another transformers/tokenizers
version) into a false ``tokenizer_mismatch``. The fingerprint here is a sha256 over a canonical view of
the parsed tokenizer instead (compact JSON with sorted keys), read from the same file as before:
``tokenizer.json`` if present, else a SentencePiece ``tokenizer.model``.

Semantic (in the fingerprint):

- tokenizer.json: ``model`` (type, vocabulary with its ids, merges, unk token, prefixes, byte fallback,
  dropout...), ``added_tokens`` (id, content and the special/normalized/lstrip/rstrip/single_word flags),
  ``normalizer``, ``pre_tokenizer``, ``post_processor`` for the tokens it adds, and ``decoder``.
- tokenizer.model (the ``ModelProto`` of sentencepiece_model.proto, decoded with the stdlib: protobuf is not
  a dependency): every piece with its score and type, in id order; the normalizer spec's charsmap (as a
  sha256), ``add_dummy_prefix``, ``remove_extra_whitespaces``, ``escape_whitespaces``; the denormalizer spec
  when sentencepiece would use one (a non-empty charsmap, sentencepiece_processor.cc:248-252); and the
  trainer-spec fields the processor reads when encoding or decoding: ``model_type`` (model_factory.cc:29),
  ``byte_fallback`` (model_interface.cc:118,140), ``treat_whitespace_as_suffix`` (normalizer.cc:35),
  ``unk_surface`` (sentencepiece_processor.cc:772) and the unk/bos/eos/pad pieces (model_interface.cc:29-46).
- tokenizer_config.json / special_tokens_map.json: the special-token roles (bos/eos/unk/sep/pad/cls/mask
  by content: a chat template writes ``bos_token``, a server stops at ``eos_token``), and ``add_bos_token``
  / ``add_eos_token`` when set (transformers rebuilds the post-processor from them:
  tokenization_utils_tokenizers.py:453-458,524-525 in transformers 5.19). For a tokenizer.model also
  ``legacy`` (False drops the dummy prefix: tokenization_utils_sentencepiece.py:78-83) and
  ``added_tokens_decoder`` (its tokens past the SentencePiece vocabulary get ids there). Roles come from
  tokenizer_config.json, overridden by special_tokens_map.json when the config has no
  ``added_tokens_decoder`` (how transformers reads them: tokenization_utils_base.py:1850-1866).

Serialization noise (left out, or written one way):

- key order, indentation, whitespace, and escapes (the JSON is parsed; a re-save writes it anew);
- tokenizer.json's ``version`` (the format's, tokenizer/serialization.rs:30) and its ``truncation`` and
  ``padding``: runtime settings that transformers resets on every call (set_truncation_and_padding,
  tokenization_utils_tokenizers.py:919-958), not part of the vocabulary;
- forms older tokenizers versions wrote for the same thing: BPE merges as ``"a b"`` strings rather than
  pairs (models/bpe/serialization.rs:86-90,145-148), BPE/Unigram fields added later and absent meaning
  their default (``ignore_merges``, ``byte_fallback``, ``fuse_unk``...), an empty BPE prefix/suffix that
  equals none (models/bpe/model.rs:481-492), Metaspace's ``add_prefix_space``/``str_rep`` where newer
  versions write ``prepend_scheme``/``split`` (pre_tokenizers/metaspace.rs:44-46,63-74), ByteLevel's
  ``use_regex`` default;
- options that touch offsets only: ByteLevel's ``trim_offsets`` as a pre-tokenizer, a ByteLevel
  post-processor (adds no token, only trims offsets: pre_tokenizers/byte_level.rs:175-199) and a
  TemplateProcessing of plain ``$A`` / ``$A $B`` with no special token (transformers 5 writes one where the
  file had a ByteLevel processor), all "adds nothing"; the ByteLevel decoder's options (its decode ignores
  them: byte_level.rs:155-172); a Sequence of one step is that step;
- added tokens listed in another order (each keeps its id); the SentencePiece trainer's own settings
  (input files, thread count, sizes, seeds), self-test data, field order in the proto, and unset fields
  against fields set to their default;
- tokenizer_config.json's ``tokenizer_class``, ``backend``, ``model_max_length``, ``padding_side``,
  ``clean_up_tokenization_spaces``, ``name_or_path`` and the like: wrapper and runtime settings that
  transformers versions write differently; ``add_prefix_space`` (what it does is in tokenizer.json's
  pre-tokenizer after any save); the extra/additional special-token lists (their tokens are in
  ``added_tokens`` with their ``special`` flag).

The chat template is not in this fingerprint: the contract's ``chat_template_fingerprint`` covers it, so a
changed template is a ``chat_template_mismatch``, not a ``tokenizer_mismatch``.

Versioning and compatibility: the contract field stays a bare sha256 (contract/model.py ``Sha256``), so every
contract in the wild still validates and no schema changes. To tell a new fingerprint from an old byte hash
when they disagree, its first six hex digits are the tag ``5e3a01`` (scheme 1), in place of the digest's;
the other 232 bits are the digest's. The gate accepts a contract's value when it equals the deployed
tokenizer's semantic fingerprint or its file's byte hash (:func:`matches`), so an old contract never becomes a
false alarm on an unchanged file. An old byte hash starts with the tag once in 2**24; such a contract is
only described as a semantic one in the mismatch message. A file that cannot be parsed (malformed JSON, not
a SentencePiece proto) gets a tagged fingerprint of its bytes: equal only when the bytes are.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TAG = "5e3a01"  # "sema(ntic)", scheme 01: a new canonical form gets a new tag, and the old one stays readable
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class TokenizerFingerprint:
    file: str  # "tokenizer.json" or "tokenizer.model"
    semantic: str  # tagged sha256 of the canonical view: what new contracts record
    byte_hash: str  # sha256 of the file's bytes: what specparity recorded before


def is_semantic(fingerprint: str) -> bool:
    return fingerprint.startswith(TAG)


def matches(recorded: str, deployed: TokenizerFingerprint) -> bool:
    """A contract's ``tokenizer_fingerprint`` holds for the deployed tokenizer: new style or old byte hash."""
    return recorded in (deployed.semantic, deployed.byte_hash)


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return TAG + hashlib.sha256(text.encode("ascii")).hexdigest()[len(TAG):]


def tokenizer_fingerprint(directory: Path, tokenizer_config: dict[str, Any] | None = None,
                          special_tokens_map: dict[str, Any] | None = None) -> TokenizerFingerprint | None:
    """Fingerprints of ``directory``'s tokenizer (None when it has neither file). ``tokenizer_config`` and
    ``special_tokens_map`` are the parsed JSON files, or read from ``directory`` when None."""
    d = Path(directory)
    name = next((n for n in TOKENIZER_FILES if (d / n).is_file()), None)
    if name is None:
        return None
    data = (d / name).read_bytes()
    if tokenizer_config is None:
        tokenizer_config = _read_optional(d / "tokenizer_config.json")
    if special_tokens_map is None:
        special_tokens_map = _read_optional(d / "special_tokens_map.json")
    sentencepiece = name == "tokenizer.model"
    tok = canonical_sentencepiece(data) if sentencepiece else canonical_tokenizer_json(data)
    if tok is None:
        tok = {"unparsed_sha256": hashlib.sha256(data).hexdigest()}
    payload = {"file": name, "tokenizer": tok,
               "config": canonical_config(tokenizer_config, special_tokens_map, sentencepiece=sentencepiece)}
    return TokenizerFingerprint(file=name, semantic=_digest(payload), byte_hash=hashlib.sha256(data).hexdigest())


def _read_optional(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# --- tokenizer.json -----------------------------------------------------------------------------------

_NOISE_KEYS = ("version", "truncation", "padding")
_SEQUENCE_KEY = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders",
                 "post_processor": "processors"}
_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "BPE": {"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
    "Unigram": {"unk_id": None, "byte_fallback": False},
}


def canonical_tokenizer_json(data: bytes | str) -> dict[str, Any] | None:
    """The semantic view of a tokenizer.json (None when it is not a JSON object)."""
    try:
        tok = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(tok, dict):
        return None
    out = {k: v for k, v in tok.items() if k not in _NOISE_KEYS and k not in _SEQUENCE_KEY and k != "model"}
    for role in _SEQUENCE_KEY:
        out[role] = _component(tok.get(role), role)
    out["model"] = _model(tok.get("model"))
    added = tok.get("added_tokens")
    if isinstance(added, list) and all(isinstance(a, dict) for a in added):
        out["added_tokens"] = sorted(added, key=lambda a: json.dumps(a, sort_keys=True))  # each keeps its id
    return out


def _model(model: Any) -> Any:
    if not isinstance(model, dict):
        return model
    m = dict(model)
    if "type" not in m and "merges" in m and isinstance(m.get("vocab"), dict):
        m["type"] = "BPE"  # files from before the model carried its type (models/mod.rs, untagged)
    for key, default in _MODEL_DEFAULTS.get(str(m.get("type")), {}).items():
        m.setdefault(key, default)
    if m.get("type") == "BPE":
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if m.get(key) == "":
                m[key] = None
        merges = m.get("merges")
        if isinstance(merges, list):
            m["merges"] = [_merge_pair(x) for x in merges]
    return m


def _merge_pair(merge: Any) -> Any:
    if isinstance(merge, str):  # the pre-0.20 form "a b", split as tokenizers does (models/bpe/model.rs)
        parts = merge.split(" ")
        return parts if len(parts) == 2 else merge
    return merge


def _component(node: Any, role: str) -> Any:
    """The canonical form of a normalizer/pre-tokenizer/post-processor/decoder; None for "does nothing"."""
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "Sequence" and isinstance(node.get(_SEQUENCE_KEY[role]), list):
        steps: list[Any] = []
        for step in (_component(s, role) for s in node[_SEQUENCE_KEY[role]]):
            if isinstance(step, dict) and step.get("type") == "Sequence":
                steps.extend(step[_SEQUENCE_KEY[role]])
            elif step is not None:
                steps.append(step)
        if len(steps) <= 1:
            return steps[0] if steps else None
        return {**node, _SEQUENCE_KEY[role]: steps}
    if kind == "Metaspace":
        return _metaspace(node)
    if kind == "ByteLevel":
        if role == "decoder":
            return {"type": "ByteLevel"}
        if role == "post_processor":
            return None
        if role == "pre_tokenizer":
            out = {k: v for k, v in node.items() if k != "trim_offsets"}
            out.setdefault("use_regex", True)
            return out
    if kind == "TemplateProcessing" and role == "post_processor" and _adds_nothing(node):
        return None
    return node


def _metaspace(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k not in ("add_prefix_space", "str_rep")}
    if "prepend_scheme" not in out:
        out["prepend_scheme"] = "never" if node.get("add_prefix_space") is False else "always"
    out.setdefault("split", True)
    return out


def _adds_nothing(node: dict[str, Any]) -> bool:
    def ids(template: Any) -> list[Any] | None:
        if not isinstance(template, list):
            return None
        seq = [p.get("Sequence") if isinstance(p, dict) else None for p in template]
        got = [s.get("id") for s in seq if isinstance(s, dict)]
        return got if len(got) == len(template) else None  # None: a SpecialToken piece, or an unknown form

    return (not node.get("special_tokens") and ids(node.get("single")) == ["A"]
            and ids(node.get("pair")) == ["A", "B"])


# --- tokenizer.model (SentencePiece ModelProto, proto2 wire format) --------------------------------------

_NORMALIZER_FIELDS = {2: "precompiled_charsmap", 3: "add_dummy_prefix", 4: "remove_extra_whitespaces",
                      5: "escape_whitespaces"}
_NORMALIZER_DEFAULTS = {"precompiled_charsmap": hashlib.sha256(b"").hexdigest(), "add_dummy_prefix": True,
                        "remove_extra_whitespaces": True, "escape_whitespaces": True}
_TRAINER_FIELDS = {3: "model_type", 35: "byte_fallback", 24: "treat_whitespace_as_suffix", 44: "unk_surface",
                   45: "unk_piece", 46: "bos_piece", 47: "eos_piece", 48: "pad_piece"}
_TRAINER_DEFAULTS = {"model_type": 1, "byte_fallback": False, "treat_whitespace_as_suffix": False,
                     "unk_surface": " \u2047 ", "unk_piece": "<unk>", "bos_piece": "<s>", "eos_piece": "</s>",
                     "pad_piece": "<pad>"}
_BOOLS = {"add_dummy_prefix", "remove_extra_whitespaces", "escape_whitespaces", "byte_fallback",
          "treat_whitespace_as_suffix"}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]  # IndexError on a truncated varint
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> dict[int, list[Any]]:
    """Field number -> values in file order (ints for varints, bytes otherwise); groups are refused."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated")
        out.setdefault(key >> 3, []).append(value)
    return out


def _message(values: list[Any] | None) -> dict[int, list[Any]]:
    return _fields(b"".join(values)) if values else {}  # proto2: repeated occurrences of a message merge


def _scalar(name: str, values: list[Any]) -> Any:
    v = values[-1]  # proto2: the last occurrence of a scalar wins
    if isinstance(v, int):
        return bool(v) if name in _BOOLS else (v - (1 << 64) if v >= 1 << 63 else v)
    if name == "precompiled_charsmap":
        return hashlib.sha256(v).hexdigest()
    return v.decode("utf-8")


def _spec(msg: dict[int, list[Any]], names: dict[int, str], defaults: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    out.update({name: _scalar(name, msg[num]) for num, name in names.items() if num in msg})
    return out


def canonical_sentencepiece(data: bytes) -> dict[str, Any] | None:
    """The semantic view of a SentencePiece model file (None when it is not one)."""
    try:
        top = _fields(data)
        pieces = []
        for raw in top.get(1, []):
            p = _fields(raw)
            piece = _scalar("piece", p[1]) if 1 in p else ""
            score = struct.unpack("<f", p[2][-1])[0] if 2 in p else 0.0
            kind = _scalar("type", p[3]) if 3 in p else 1  # NORMAL
            if not piece:
                return None  # "piece must not be empty" (sentencepiece_model.proto)
            pieces.append([piece, score, kind])
        if not pieces:
            return None
        trainer = _spec(_message(top.get(2)), _TRAINER_FIELDS, _TRAINER_DEFAULTS)
        normalizer = _spec(_message(top.get(3)), _NORMALIZER_FIELDS, _NORMALIZER_DEFAULTS)
        denormalizer = _spec(_message(top.get(5)), _NORMALIZER_FIELDS, _NORMALIZER_DEFAULTS)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return None
    for key in ("unk_piece", "bos_piece", "eos_piece", "pad_piece"):
        trainer[key] = trainer[key] or _TRAINER_DEFAULTS[key]  # an empty piece name means the default
    used = denormalizer["precompiled_charsmap"] != _NORMALIZER_DEFAULTS["precompiled_charsmap"]
    return {"pieces": pieces, "trainer": trainer, "normalizer": normalizer,
            "denormalizer": denormalizer if used else None}


# --- tokenizer_config.json / special_tokens_map.json ---------------------------------------------------

def _role(value: Any) -> Any:
    return value.get("content") if isinstance(value, dict) else value


def canonical_config(tokenizer_config: dict[str, Any], special_tokens_map: dict[str, Any], *,
                     sentencepiece: bool) -> dict[str, Any]:
    roles = {r: _role(tokenizer_config.get(r)) for r in ROLES}
    if "added_tokens_decoder" not in tokenizer_config:
        roles.update({r: _role(v) for r, v in special_tokens_map.items() if r in ROLES})
    out: dict[str, Any] = {"roles": roles, "add_bos_token": tokenizer_config.get("add_bos_token"),
                           "add_eos_token": tokenizer_config.get("add_eos_token")}
    if sentencepiece:
        out["legacy"] = tokenizer_config.get("legacy")
        decoder = tokenizer_config.get("added_tokens_decoder")
        if isinstance(decoder, dict):
            keep = ("content", "special", "lstrip", "rstrip", "single_word", "normalized")
            out["added_tokens_decoder"] = {
                str(k): {f: v.get(f) for f in keep} if isinstance(v, dict) else v for k, v in decoder.items()}
    return out
