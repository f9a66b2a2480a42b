"""``streamkit admin``: the admin page's address with its token, from the running host.

The token a host's HTTP surface needs is handed out over its control socket,
which only the socket's owner can use, so this command works for exactly the
people the socket works for. It prints, for each live host on the log that
serves HTTP, the admin page's address with the token in its fragment (a
browser never sends a fragment to the server; the page moves the token into
the tab's storage and out of the address bar). ``--token`` prints the bare
token, for ``curl -H "Authorization: Bearer $(streamkit admin --token)"``.
Nothing is written.
"""

from __future__ import annotations

import argparse
import webbrowser
from typing import TextIO

from streamkit.cli._args import live_host_sockets
from streamkit.cli._common import add_db_flag, add_socket_flag, served
from streamkit.control import request_sync
from streamkit.errors import InvalidRequest

__all__ = ["add_admin"]


def add_admin(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "admin",
        help="the admin page's address, with the token that opens it",
        description="Print the address of the admin page of each running host on the log "
        "that serves HTTP, with the host's token in it (only the owner of the host's "
        "control socket can ask). --token prints the bare token, for other HTTP clients.",
    )
    add_db_flag(p)
    add_socket_flag(p)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--token", action="store_true", help="print the bare token instead of the page's address"
    )
    shown.add_argument(
        "--open", action="store_true", help="also open the page in the default browser"
    )
    p.set_defaults(handler=_cmd_admin)


def _cmd_admin(args: argparse.Namespace, out: TextIO) -> int:
    sockets = live_host_sockets(args.db, getattr(args, "socket", None))
    if not sockets:
        raise InvalidRequest(
            f"no host is running on {args.db} (the token is asked of a running host); start "
            "one with `streamkit host ... --http 127.0.0.1:8700`",
            details={"db": str(args.db)},
        )
    served_http = [
        access
        for socket in sockets
        for access in request_sync(socket, "http", db=served(args))["served"]
    ]
    if not served_http:
        raise InvalidRequest(
            f"the host on {args.db} serves no HTTP; start it with --http 127.0.0.1:8700 (or "
            'http = "127.0.0.1:8700" in streamkit.toml)',
            details={"db": str(args.db)},
        )
    for access in served_http:
        out.write((access["token"] if args.token else access["admin"]) + "\n")
    if args.open:
        webbrowser.open(served_http[0]["admin"])
    return 0
