"""Python client for Grove env-servers (protocol version 1; see protocol/PROTOCOL.md)."""

from .client import PROTOCOL_VERSION, AsyncClient, action, decode, encode, task
from .errors import ERROR_NUMBERS, ConnectionClosed, GroveError, UnexpectedReply
from .sync import Client

__all__ = [
    "PROTOCOL_VERSION",
    "AsyncClient",
    "Client",
    "ConnectionClosed",
    "ERROR_NUMBERS",
    "GroveError",
    "UnexpectedReply",
    "action",
    "decode",
    "encode",
    "task",
]
