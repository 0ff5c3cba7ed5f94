"""SentencePiece models for tests: trained by sentencepiece's own trainer, and edited at the protobuf wire level
(protobuf is not installed; sentencepiece_model.proto gives the field numbers)."""

from __future__ import annotations

import inspect
import io
import json
from pathlib import Path
from typing import Any


def train_sentencepiece() -> bytes:
    """A real BPE model with byte fallback (like Llama 2's), 600 pieces, from stdlib docstrings; one thread."""
    import collections
    import random
    import shutil
    import textwrap

    import sentencepiece as spm

    lines = [ln for m in (collections, json, textwrap, inspect, random, shutil, io)
             for ln in (inspect.getdoc(m) or "").splitlines() if ln.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=600, model_type="bpe",
                                   byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)
    return buf.getvalue()


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def records(buf: bytes) -> list[tuple[int, int, bytes]]:
    """(field, wire type, payload) of each top-level record: varint bytes, fixed bytes or the delimited body."""
    out, i = [], 0

    def varint(i: int) -> tuple[int, int]:
        n = shift = 0
        while True:
            b = buf[i]
            n |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return n, i

    while i < len(buf):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            _, j = varint(i)
        elif wire == 2:
            size, i = varint(i)
            j = i + size
        else:
            j = i + (8 if wire == 1 else 4)
        out.append((key >> 3, wire, buf[i:j]))
        i = j
    return out


def encode(records: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(varint(f << 3 | w) + (varint(len(p)) + p if w == 2 else p) for f, w, p in records)


def edit(buf: bytes, field: int, index: int, sub: int, wire: int, payload: bytes) -> bytes:
    """``buf`` with sub-field ``sub`` of the ``index``-th top-level record of ``field`` set to ``payload``."""
    recs = records(buf)
    at = [i for i, r in enumerate(recs) if r[0] == field][index]
    inner = [r for r in records(recs[at][2]) if r[0] != sub] + [(sub, wire, payload)]
    recs[at] = (field, 2, encode(inner))
    return encode(recs)


def processor(model: bytes) -> Any:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=model)


def target_dir(root: Path, name: str, model: bytes) -> Path:
    """A target directory ``root/name`` with this tokenizer.model and a config.json (read_target needs one)."""
    d = root / name
    d.mkdir()
    (d / "tokenizer.model").write_bytes(model)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8,
        "vocab_size": 600, "torch_dtype": "float32"}), encoding="utf-8")
    return d
