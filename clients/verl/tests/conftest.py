"""Makes grove_verl and grove_client importable without installing them; starts a real
env-server over the wiki-18 sample corpus (like clients/python/tests/conftest.py); loads
SmolLM2-135M-Instruct (tests/smollm2.py) once per session."""

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(REPO / "clients" / "python" / "src"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

import envserver  # noqa: E402  (after the path is set)

missing = envserver.missing
server_binary = envserver.server_binary


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """`ws://` URL of a running env-server; killed at the end of the session."""
    yield from envserver.serve(tmp_path_factory)

@pytest.fixture(scope="session")
def smollm2_dir():
    """A Hugging Face folder of SmolLM2-135M-Instruct (converted once from the GGUF)."""
    import smollm2

    path = smollm2.ensure_hf()
    if path is None:
        missing(
            "no SmolLM2-135M-Instruct GGUF: run `cargo xtask assets`, or set GROVE_SMOLLM2_GGUF "
            "(see clients/verl/tests/smollm2.py)"
        )
    return path
