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
