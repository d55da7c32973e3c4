"""Content ids: the one JSON text of an object and its 48-bit id, and strict JSON reading.

An id is the first 12 hex digits of the sha256 of a canonical JSON text, read as an
integer: 48 bits, so a float64 (what asv stores) holds it exactly.
"""

from __future__ import annotations

import hashlib
import json

ID_HEX_DIGITS = 12


def canonical(obj) -> str:
    """The one JSON text for ``obj``: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def text_id(text: str) -> int:
    """48-bit id of a text: the first 12 hex digits of its sha256."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_HEX_DIGITS], 16)


def object_id(obj) -> int:
    """48-bit id of the canonical JSON text of ``obj``."""
    return text_id(canonical(obj))


def hex_id(ident: int | float) -> str:
    """The 12-digit hex spelling of an id (as asv stores it, maybe a float)."""
    return f"{int(ident):0{ID_HEX_DIGITS}x}"


def no_constant(name: str):
    """For json's ``parse_constant``: NaN, Infinity and -Infinity are Python's extension, no
    JSON number (RFC 8259), and nothing this project writes holds them."""
    raise ValueError(f"{name} is not a JSON number (RFC 8259)")
