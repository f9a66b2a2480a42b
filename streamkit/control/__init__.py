"""The control socket of a running host: its server, its clients and its wire format."""

from streamkit.control._control import (
    MAX_REQUEST_BYTES,
    MAX_SOCKET_PATH_BYTES,
    ControlClient,
    ControlHandler,
    ControlServer,
    NoArgs,
    Operation,
    error_from_reply,
    host_socket,
    live_server_at,
    request_sync,
)

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_SOCKET_PATH_BYTES",
    "ControlClient",
    "ControlHandler",
    "ControlServer",
    "NoArgs",
    "Operation",
    "error_from_reply",
    "host_socket",
    "live_server_at",
    "request_sync",
]
