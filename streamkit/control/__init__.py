"""The control socket of a running host: its server, its clients and its wire format."""

from streamkit.control._client import ControlClient, host_socket, request_sync
from streamkit.control._server import ControlHandler, ControlServer, NoArgs, Operation
from streamkit.control._socket import (
    MAX_SOCKET_PATH_BYTES,
    check_private_directory,
    check_socket_path,
    live_server_at,
)
from streamkit.control._wire import MAX_REQUEST_BYTES, error_from_reply

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_SOCKET_PATH_BYTES",
    "ControlClient",
    "ControlHandler",
    "ControlServer",
    "NoArgs",
    "Operation",
    "check_private_directory",
    "check_socket_path",
    "error_from_reply",
    "host_socket",
    "live_server_at",
    "request_sync",
]
