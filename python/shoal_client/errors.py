"""What can go wrong talking to a daemon (the Rust ``ClientError``)."""

from __future__ import annotations

from .codec import Code

__all__ = [
    "ShoalClientError",
    "ShoalError",
    "Disconnected",
    "Unreachable",
    "ProtocolError",
    "InvalidRequest",
]


class ShoalClientError(Exception):
    """The base of every error this package raises about a connection."""


class ShoalError(ShoalClientError):
    """The daemon sent an ``Error`` frame: it refused the connection, or a
    request (a leave of a group not joined, a limit, ...).

    ``code`` is a :class:`~shoal_client.Code` when the code is known, else
    the plain number; ``text`` says more. The connection goes on unless the
    daemon closes it (then the next receive raises :class:`Disconnected`).
    """

    def __init__(self, code: int, text: str) -> None:
        try:
            code = Code(code)
        except ValueError:
            pass
        super().__init__(f"{text} (code {int(code)})")
        self.code: int = code
        self.text = text


class Disconnected(ShoalClientError):
    """The daemon closed the connection or said ``Disconnect`` (or this
    client was closed)."""

    def __init__(self, why: str = "disconnected from the daemon") -> None:
        super().__init__(why)


class Unreachable(ShoalClientError):
    """No daemon answers at the endpoint (no socket, connection refused)."""

    def __init__(self, endpoint: str, cause: OSError) -> None:
        super().__init__(f"cannot reach the daemon at {endpoint}: {cause}")
        self.endpoint = endpoint
        self.cause = cause


class ProtocolError(ShoalClientError):
    """The daemon sent bytes that are not a valid frame, or a valid frame
    with no business there."""


class InvalidRequest(ShoalClientError, ValueError):
    """A request refused before sending (an empty or overlong name, no
    groups, a payload over the limit); nothing was sent. The daemon would
    answer it with a malformed-frame error and close the connection."""


class WouldBlock(ShoalClientError):
    """``try_multicast`` found the connection to the daemon full (a message
    accepted earlier is not all written yet); nothing was sent. Try again
    later, or send blocking."""

    def __init__(self) -> None:
        super().__init__("the daemon is not taking more yet (back-pressure); nothing was sent")
