"""A non-Rust decoder reads Grove frames: every golden frame written by the Rust encoder
decodes with the `msgpack` package to exactly the documented value, and re-encoding that value
the way a Python client would gives bytes the Rust decoder accepts (checked on the Rust side by
the same golden files)."""

import json
import pathlib

import msgpack
import pytest

from wire_values import as_json, as_wire, value_types

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "golden"
NAMES = sorted(p.stem for p in GOLDEN.glob("*.hex"))


def test_there_are_golden_frames_for_requests_and_responses():
    assert any(n.startswith("request_") for n in NAMES)
    assert any(n.startswith("response_") for n in NAMES)
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_frame_decodes_to_documented_value(name):
    frame = bytes.fromhex((GOLDEN / f"{name}.hex").read_text().strip())
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    decoded = as_json(msgpack.unpackb(frame, raw=False, strict_map_key=False))
    assert decoded == expected
    # Types matter on the wire, not only values: floats stay floats, ints stay ints.
    assert value_types(decoded) == value_types(expected)


@pytest.mark.parametrize("name", NAMES)
def test_python_encoding_is_byte_identical(name):
    """msgpack-python writes maps in insertion order and picks the smallest int encoding, as
    rmp-serde does, so a Python client produces the very same bytes."""
    frame = bytes.fromhex((GOLDEN / f"{name}.hex").read_text().strip())
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert msgpack.packb(as_wire(expected), use_bin_type=True) == frame
