"""The client's table of error numbers is the one PROTOCOL.md documents (which the Rust test
`protocol/tests/protocol_doc.rs` checks against the server's `ErrorCode`)."""

import pathlib
import re

from grove_client.errors import ERROR_NUMBERS

DOC = pathlib.Path(__file__).resolve().parents[3] / "protocol" / "PROTOCOL.md"


def documented_codes():
    """Rows `| `name` | number | ...` of the document: its error-code table."""
    table = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([a-z_]+)` \| (\d+) \|", line)
        if m:
            table[m.group(1)] = int(m.group(2))
    return table


def test_client_error_numbers_match_the_protocol_document():
    table = documented_codes()
    assert len(table) > 10
    assert table == ERROR_NUMBERS
