"""A real env-server over the wiki-18 sample corpus for a pytest session: shared by the Python
client's tests and the verl package's tests (clients/verl/tests/conftest.py imports it)."""

import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
CORPUS = REPO.parent / "shared" / "fixtures" / "wiki18-sample.jsonl"

# `cargo xtask test` sets this: there a missing server, model or fixture is a failure, not a skip.
REQUIRED = os.environ.get("GROVE_REQUIRE_ENV_SERVER") == "1"


def missing(why):
    if REQUIRED:
        pytest.fail(why)
    pytest.skip(why)


def server_binary():
    """`$GROVE_ENV_SERVER`, else `target/debug/env-server`, else None."""
    from_env = os.environ.get("GROVE_ENV_SERVER")
    if from_env and not pathlib.Path(from_env).is_file():
        pytest.fail(f"GROVE_ENV_SERVER={from_env} is not a file")
    for candidate in [from_env, REPO / "target" / "debug" / "env-server"]:
        if candidate and pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path_factory):
    """Generator for a session fixture: yields the `ws://` URL of a running env-server and kills
    it at the end of the session."""
    binary = server_binary()
    if binary is None:
        missing("no env-server binary: set GROVE_ENV_SERVER or run `cargo build -p grove-env-server --bin env-server`")
    if not CORPUS.is_file():
        missing(f"no wiki-18 fixture at {CORPUS}")
    work = tmp_path_factory.mktemp("env-server")
    corpus = work / CORPUS.name  # the server writes its index beside the corpus
    shutil.copy(CORPUS, corpus)
    port = free_port()
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "serve", "--corpus", str(corpus), "--bind", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"env-server exited with {proc.returncode}: {(work / 'server.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("env-server did not start listening within 120 s")
                time.sleep(0.1)
        yield f"ws://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
