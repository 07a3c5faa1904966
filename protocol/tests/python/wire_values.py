"""Helpers shared by the Python protocol tests."""


def value_types(v):
    """The Python type name of every leaf of a decoded value, keeping its structure: MessagePack
    tells floats from integers, so a test comparing values must compare their types too
    (`1.0 == 1` in Python)."""
    if isinstance(v, dict):
        return {k: value_types(x) for k, x in v.items()}
    if isinstance(v, list):
        return [value_types(x) for x in v]
    return type(v).__name__


def as_json(value):
    """The JSON rendering of a decoded frame: a MessagePack `bin` (step data) is shown as the
    list of its byte values, as serde_json writes bytes."""
    if isinstance(value, bytes):
        return list(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def as_wire(value, key=None):
    """The reverse for encoding: the `data` fields (the protocol's only `bin`) back to bytes."""
    if key == "data" and isinstance(value, list):
        return bytes(value)
    if isinstance(value, dict):
        return {k: as_wire(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [as_wire(v) for v in value]
    return value
