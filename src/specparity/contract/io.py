"""Load, save, hash and describe contracts.

The content hash is sha256 over the canonical JSON of the contract *as stored* without ``content_hash``
(keys sorted, no whitespace), so it is stable across key order and formatting of the file, and a later
specparity that adds a defaulted field still verifies a contract an older one wrote (the defaults it fills
in are not part of what was hashed). Loading never modifies the file it reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from specparity.contract.model import SCHEMA_VERSION, Contract
from specparity.errors import InputError

if TYPE_CHECKING:
    from specparity.contract.probes import ProbePack

SCHEMA_FILENAME = f"contract.v{SCHEMA_VERSION}.schema.json"


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def stored_hash(data: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a stored contract object without its ``content_hash`` key."""
    body = {k: v for k, v in data.items() if k != "content_hash"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def content_hash(contract: Contract) -> str:
    """The hash :func:`dump_contract` stores for ``contract``: :func:`stored_hash` of the JSON it writes."""
    return stored_hash(contract.model_dump(mode="json"))


def with_hash(contract: Contract) -> Contract:
    return contract.model_copy(update={"content_hash": content_hash(contract)})


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def validation_error(err: ValidationError, path: str | Path) -> InputError:
    """Turn pydantic's report into a short message that names the file and the first bad field."""
    errors = err.errors(include_url=False)
    first = errors[0]
    field = _field_path(tuple(first["loc"]))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field (not in contract schema v1)"
    elif first["type"] == "literal_error" and field == "schema_version":
        msg = f"unsupported schema_version {first.get('input')!r}; this specparity reads schema_version {SCHEMA_VERSION}"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return InputError(msg + more, path=path, field=field)


def parse_contract(data: Any, *, path: str | Path = "<contract>") -> Contract:
    if not isinstance(data, dict):
        raise InputError("a contract is a JSON object", path=path)
    try:
        contract = Contract.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, path) from None
    if contract.content_hash is not None:
        actual = stored_hash(data)
        if actual != contract.content_hash:
            raise InputError(
                f"content_hash does not match the contract's content (computed {actual[:12]}…); "
                "the file was edited after it was written: re-run `specparity contract rehash` if that was intended",
                path=path,
                field="content_hash",
            )
    return contract


def load_json(path: str | Path) -> object:
    """The JSON in ``path``; a missing, unreadable or malformed file is an :class:`InputError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such file", path=p) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", path=p) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", path=p) from None


def load_contract(path: str | Path) -> Contract:
    """Read and validate a contract file. Raises :class:`InputError` naming the file and field."""
    return parse_contract(load_json(path), path=Path(path))


def dump_contract(contract: Contract) -> str:
    """The contract as pretty JSON (with its content hash), ending in a newline."""
    return json.dumps(with_hash(contract).model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def save_contract(contract: Contract, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(dump_contract(contract), encoding="utf-8")
    return p


def json_schema() -> dict[str, Any]:
    schema = Contract.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://specparity.dev/schema/{SCHEMA_FILENAME}"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def probe_pack_path(contract: Contract, contract_path: str | Path) -> Path:
    if contract.probes is None:
        raise InputError("this contract has no probe pack (its layout is assumed, see layout_assumed)",
                         path=contract_path, field="probes")
    return Path(contract_path).resolve().parent / contract.probes.file


def read_contract_probes(contract: Contract, contract_path: str | Path) -> ProbePack:
    """The contract's probe pack, checked against its sha256; InputError when the contract has none."""
    from specparity.contract.probes import read_probe_pack

    path = probe_pack_path(contract, contract_path)
    assert contract.probes is not None  # probe_pack_path raised otherwise
    pack = read_probe_pack(path, expected_sha256=contract.probes.sha256)
    vocab = contract.target.vocab_size
    for i, s in enumerate(pack.samples):
        if int(s.input_ids.max()) >= vocab:
            raise InputError(f"token id {int(s.input_ids.max())} is outside the target's vocabulary "
                             f"(target.vocab_size {vocab})", path=path, field=f"sample_{i}.input_ids")
    if pack.hidden_size != contract.target.hidden_size:
        raise InputError(f"hidden_size {pack.hidden_size} differs from the contract's target.hidden_size "
                         f"{contract.target.hidden_size}", path=path, field="metadata.hidden_size")
    return pack
