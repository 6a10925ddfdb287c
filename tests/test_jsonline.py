"""The payload's JSON lines (``workloads.jsonline``) give exactly what ``json`` gives."""

from __future__ import annotations

import json
import random

import pytest

from workloads import jsonline

MESSAGES = [
    {"op": "ready"},
    {"op": "done", "k": 3, "digest": "ab" * 32, "validated": None, "cpu_s": 0.018502},
    {"op": "checked", "k": 0, "digest": None, "validated": True},
    {"op": "error", "k": None, "message": 'PayloadError: round 4 out of order: "x", \\ y'},
    {"op": "error", "k": 2, "message": "tab\there\nnewline\r\x00\x1f\x7f é ß € 𝄞 \ud800"},
    {"op": "done", "k": -1, "cpu_s": 1e-07, "big": 10**30, "neg": -0.0, "inf": float("inf")},
    {"op": "x", "nested": {"a": [1, 2]}, "list": [None]},
    {1: "int key"},
    {},
]


@pytest.mark.parametrize("message", MESSAGES)
def test_written_as_json_writes_it(message: dict[object, object]) -> None:
    """Flat messages and the rest (nested, non-string keys, inf) alike: json's own text."""
    assert jsonline.dumps(message) == json.dumps(message)  # type: ignore[arg-type]


def test_random_flat_messages_round_trip() -> None:
    """Seeded random flat objects of every scalar the protocol uses: written as json writes
    them, read back (compact and spaced) as json reads them."""
    rng = random.Random(7)
    alphabet = 'abc ,:"\\{}[]\t\n\x01é€𝄞0123456789-.'
    for _ in range(2000):
        message = {}
        for _ in range(rng.randrange(0, 6)):
            key = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
            number = rng.random() * 10 ** rng.randrange(-8, 8)
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
            value = rng.choice([None, True, False, rng.randrange(-(10**6), 10**6), number, text])
            message[key] = value
        text = jsonline.dumps(message)
        assert text == json.dumps(message)
        for line in (text, json.dumps(message, separators=(",", ":")), f"  {text}\n"):
            assert jsonline.loads(line) == json.loads(line)


@pytest.mark.parametrize(
    "line",
    ['{"op":"round","k":1}', '{"op": "check", "k": 0}', '{"op":"exit"}', "{}", " { } ",
     '{"k":-0}', '{"k":"a","k":"b"}', '{"op":"x","v":1.5}', '{"op":"x","v":[1]}',
     '{"op":"a:b","k":1}', '{"op":"\\u0041"}', '{"v":true,"w":false,"x":null}'],
)  # fmt: skip
def test_read_as_json_reads_it(line: str) -> None:
    """The host's requests and anything near them: the same object as ``json.loads``."""
    assert jsonline.loads(line) == json.loads(line)


@pytest.mark.parametrize(
    "line",
    ["", "{", '{"k":01}', '{"k":1,}', '{"k"1}', "[1]x", '{"k":1}}', '{"k":tru}', "{k:1}",
     '{"k":1 2}', '{"a":"\x01"}', "\x0c{}", '{"k":+1}', '{"k":\u0661}', "not json"],
)  # fmt: skip
def test_garbage_is_refused_as_json_refuses_it(line: str) -> None:
    """What json refuses, ``loads`` refuses with json's own error (what json accepts of these
    it reads the same)."""
    try:
        want = json.loads(line)
    except json.JSONDecodeError:
        with pytest.raises(json.JSONDecodeError):
            jsonline.loads(line)
    else:
        assert jsonline.loads(line) == want
