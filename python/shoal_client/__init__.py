"""The Shoal client library for Python: how an application talks to its
local ``shoal daemon`` (the pure-Python counterpart of the Rust crate
``shoal-client``; the wire format is ``docs/client-protocol.md``).

::

    from shoal_client import Client, Message, Service

    with Client.connect("alice") as client:          # the default Unix socket
        print("I am", client.private_group)          # "#alice#<node>"
        client.join("chat")
        client.multicast(Service.AGREED, "chat", b"hello")
        for event in client:
            if isinstance(event, Message):
                print(event.sender, event.payload)
            else:
                print(event.group, event.reason.name, event.members)

Standard library only. :mod:`shoal_client.aio` has the same API for asyncio;
:mod:`shoal_client.codec` encodes and decodes the frames.
"""

from ._common import (
    DISCONNECT_WAIT,
    DaemonFlow,
    FlowControl,
    FlowControlState,
    default_socket_path,
)
from .client import Client, status
from .codec import SELF_DISCARD, Code, FrameError, Limits, Membership, Message, Reason, Service
from .errors import (
    Disconnected,
    InvalidRequest,
    ProtocolError,
    ShoalClientError,
    ShoalError,
    Unreachable,
    WouldBlock,
)

#: Error codes of ``ShoalError.code`` (also as :class:`Code`).
MALFORMED = Code.MALFORMED
PROTOCOL = Code.PROTOCOL
NAME_TAKEN = Code.NAME_TAKEN
AUTH = Code.AUTH
UNSUPPORTED_SERVICE = Code.UNSUPPORTED_SERVICE
LIMIT = Code.LIMIT
BAD_GROUP = Code.BAD_GROUP
SLOW_CLIENT = Code.SLOW_CLIENT
SHUTDOWN = Code.SHUTDOWN
UNAVAILABLE = Code.UNAVAILABLE

__version__ = "0.1.0"

__all__ = [
    "Client",
    "status",
    "default_socket_path",
    "DISCONNECT_WAIT",
    "Service",
    "Reason",
    "Message",
    "Membership",
    "Limits",
    "Code",
    "ShoalClientError",
    "ShoalError",
    "Disconnected",
    "Unreachable",
    "ProtocolError",
    "InvalidRequest",
    "WouldBlock",
    "FlowControl",
    "FlowControlState",
    "DaemonFlow",
    "SELF_DISCARD",
    "FrameError",
    "MALFORMED",
    "PROTOCOL",
    "NAME_TAKEN",
    "AUTH",
    "UNSUPPORTED_SERVICE",
    "LIMIT",
    "BAD_GROUP",
    "SLOW_CLIENT",
    "SHUTDOWN",
    "UNAVAILABLE",
]
