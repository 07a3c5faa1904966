"""PROTOCOL.md's byte-level examples hold for a non-Rust decoder: each hex block decodes with
the `msgpack` package to exactly the value shown in the json block after it."""

import json
import pathlib
import re

import msgpack
import pytest

from wire_values import as_json, value_types

DOC = pathlib.Path(__file__).resolve().parent.parent.parent / "PROTOCOL.md"
GOLDEN_COMMENT = re.compile(r"^\s*<!--\s*golden:\s*(\S+)\s*-->\s*$")


def _fenced(lines, i, lang, name):
    """The body of the ```lang block starting at line i (after blank lines), and the next index."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or lines[i].strip() != "```" + lang:
        raise ValueError(f"{name}: expected a ```{lang} block at line {i + 1}")
    start = i + 1
    end = start
    while end < len(lines) and lines[end].strip() != "```":
        end += 1
    if end == len(lines):
        raise ValueError(f"{name}: unterminated ```{lang} block")
    return "\n".join(lines[start:end]), end + 1


def parse_examples(text):
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = GOLDEN_COMMENT.match(line)
        if not m:
            continue
        name = m.group(1)
        hex_text, nxt = _fenced(lines, i + 1, "hex", name)
        json_text, _ = _fenced(lines, nxt, "json", name)
        out.append((name, hex_text, json_text))
    return out


EXAMPLES = parse_examples(DOC.read_text(encoding="utf-8"))


def test_doc_has_examples_for_every_hex_block():
    text = DOC.read_text(encoding="utf-8")
    hex_blocks = sum(1 for line in text.splitlines() if line.strip() == "```hex")
    assert len(EXAMPLES) == hex_blocks > 0
    names = {n for n, _, _ in EXAMPLES}
    assert {"request_hello", "response_welcome", "response_error"} <= names


@pytest.mark.parametrize("name,hex_text,json_text", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_hex_block_decodes_to_json_block(name, hex_text, json_text):
    frame = bytes.fromhex("".join(hex_text.split()))
    decoded = as_json(msgpack.unpackb(frame, raw=False, strict_map_key=False))
    expected = json.loads(json_text)
    assert decoded == expected
    # 1.0 == 1 in Python; the wire distinguishes floats from integers, so the doc must too.
    assert value_types(decoded) == value_types(expected)


def test_parser_refuses_a_comment_without_hex():
    with pytest.raises(ValueError):
        parse_examples("<!-- golden: x -->\n```json\n{}\n```\n")
