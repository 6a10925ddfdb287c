r"""The payload's JSON lines without ``json``: the protocol's flat objects, written and read.

``json`` imports ``re`` and ``enum`` (its scanner's patterns): about 8 ms at the payload's
start here, several times that in gVisor and in a TCG guest, paid after Ready by every
environment. The protocol's messages are flat objects of strings, integers, floats, booleans
and null, so the payload writes them itself, as ``json.dumps`` would (ASCII, ``\uXXXX``
escapes), and reads the host's requests (``{"op":"round","k":1}``) with a scanner for flat
objects of unescaped strings, integers, booleans and null. Anything else, written or read, goes
to ``json`` itself (imported then): the result is always what ``json`` gives.
"""

from __future__ import annotations

TYPE_CHECKING = False  # ``typing`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from typing import Any

_LITERALS = {"true": True, "false": False, "null": None}
_DIGITS = "0123456789"
_SPACE = " \t\n\r"  # JSON's whitespace (``str.strip`` alone strips more)
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}  # written as they are


def dumps(message: dict[str, Any]) -> str:
    """``json.dumps(message)`` for a flat object (``json`` itself for anything else)."""
    parts: list[str] = []
    for key, value in message.items():
        if not isinstance(key, str):
            return str(_json().dumps(message))
        text = _value(value)
        if text is None:
            return str(_json().dumps(message))
        parts.append(f"{_string(key)}: {text}")
    return "{" + ", ".join(parts) + "}"


def loads(line: str) -> Any:
    """``json.loads(line)``: a flat object of unescaped strings, integers, booleans and null is
    read here, anything else by ``json`` itself (which also gives the errors)."""
    found = _flat_object(line.strip(_SPACE))
    return _json().loads(line) if found is None else found


def _value(value: object) -> str | None:
    """The JSON text of a scalar, None when it is not one ``dumps`` writes itself."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else ("true" if value else "false")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value - value == 0 else None  # inf and nan: as json writes them
    if isinstance(value, str):
        return _string(value)
    return None


def _string(text: str) -> str:
    """A JSON string literal, ASCII only, as ``json.dumps`` writes it."""
    if all(c in _PLAIN for c in text):
        return f'"{text}"'
    out = []
    for c in text:
        if c in _PLAIN:
            out.append(c)
        elif c in '"\\':
            out.append("\\" + c)
        elif c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) > 0xFFFF:  # a surrogate pair, as json writes it
            n = ord(c) - 0x10000
            out.append(f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(c):04x}")
    return '"' + "".join(out) + '"'


def _flat_object(text: str) -> dict[str, Any] | None:
    """The object ``text`` holds if it is flat and simple (see ``loads``), else None."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return None
    body = text[1:-1].strip(_SPACE)
    out: dict[str, Any] = {}
    if not body:
        return out
    for item in body.split(","):
        key, colon, value = item.partition(":")
        key, value = key.strip(_SPACE), value.strip(_SPACE)
        name = _plain_string(key)
        if not colon or name is None or name in out:  # a repeated key: json keeps the last
            return None
        if value in _LITERALS:
            out[name] = _LITERALS[value]
        elif (
            (digits := value.removeprefix("-"))
            and all(c in _DIGITS for c in digits)
            and (digits == "0" or digits[0] != "0")
        ):
            out[name] = int(value)
        elif (string := _plain_string(value)) is not None:
            out[name] = string
        else:
            return None
    return out


def _plain_string(text: str) -> str | None:
    """The content of a JSON string literal without escapes (a comma or colon inside one is
    read by ``json``), else None."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return None
    inner = text[1:-1]
    return inner if all(c in _PLAIN and c not in ",:" for c in inner) else None


def _json() -> Any:
    """The ``json`` module, imported when a message is not one this module handles."""
    import json  # only for messages outside the protocol's flat objects

    return json
