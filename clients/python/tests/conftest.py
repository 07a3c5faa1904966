"""Makes `grove_client` importable without installing it, and starts a real env-server over
the wiki-18 sample corpus for the whole test session."""

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import envserver  # noqa: E402  (after the path is set)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """`ws://` URL of a running env-server; killed at the end of the session."""
    yield from envserver.serve(tmp_path_factory)
