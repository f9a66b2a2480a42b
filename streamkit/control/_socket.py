"""The control socket's file: created private, never over a live server, stale ones cleared.

Private to :mod:`streamkit.control`. :func:`bind_private_socket` probes what is
at the path, removes a socket file nothing answers on, binds, chmods the file to
0600 and only then listens, so no other user can ever connect. Servers
starting in one directory take an ``flock`` on it around probe-unlink-bind, so
two of them cannot both decide a path is stale and steal it from each other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from streamkit.errors import ControlSocketInUse, InvalidRequest, UntrustedSocket

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "bind_private_socket",
    "check_private_directory",
    "check_socket_path",
    "check_trusted_socket",
    "live_server_at",
    "probe",
]

MAX_SOCKET_PATH_BYTES: Final = 107 if sys.platform.startswith("linux") else 103
"""The longest Unix socket path ``bind`` accepts (``sun_path`` less its NUL byte)."""

_PROBE_TIMEOUT = 1.0


def bind_private_socket(path: Path) -> socket.socket:
    """Bind a listening socket at ``path`` that only this user can connect to."""
    name = os.fspath(path)
    size = len(os.fsencode(name))
    if size > MAX_SOCKET_PATH_BYTES:
        raise InvalidRequest(
            f"control socket path {name!r} is {size} bytes, over the {MAX_SOCKET_PATH_BYTES} "
            "bytes a Unix socket path may have; choose a shorter path (socket = ... in "
            "streamkit.toml); nothing was created",
            details={"path": name, "size": size, "limit": MAX_SOCKET_PATH_BYTES},
        )
    with _directory_lock(path.parent):
        _clear_stale_socket(name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound = False
        try:
            try:
                sock.bind(name)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ControlSocketInUse(
                        f"control socket path {name!r} was taken while starting (another "
                        "server won the race); nothing was changed; stop it or choose another "
                        "socket path",
                        details={"path": name},
                    ) from exc
                raise InvalidRequest(
                    f"could not create the control socket at {name!r}: {exc.strerror or exc}; "
                    "check that the directory exists and is writable, or choose another "
                    "path; nothing was created",
                    details={"path": name, "errno": exc.errno},
                ) from exc
            bound = True
            # Before listen() nobody can connect, so the file is never reachable
            # with the umask's looser mode.
            os.chmod(name, 0o600)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            if bound:  # never remove a file some other server bound
                with contextlib.suppress(OSError):
                    os.unlink(name)
            raise
    return sock


def check_socket_path(path: str | os.PathLike[str]) -> None:
    """Refuse a socket path where something that is not a socket is (a file, a directory).

    A host calls it before it opens its log, so a start refused for it
    creates nothing; a socket there is judged when the server binds.
    """
    name = os.fspath(path)
    try:
        info = os.lstat(name)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a socket"
        raise ControlSocketInUse(
            f"{name!r} exists and is {kind}; it was left untouched and no server was "
            "started; remove it or choose another socket path",
            details={"path": name},
        )


def _clear_stale_socket(name: str) -> None:
    try:
        os.lstat(name)
    except FileNotFoundError:
        return
    check_socket_path(name)
    verdict = probe(name)
    if verdict != "stale":
        raise ControlSocketInUse(
            f"a control server already answers at {name!r} ({verdict}); another host is "
            "probably running on this database; nothing was changed; stop it, talk to it, or "
            "give this host another socket path",
            details={"path": name},
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def probe(name: str) -> str:
    """``"live"`` if something accepts a connection, ``"stale"`` if nothing listens, else why."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(_PROBE_TIMEOUT)
        try:
            client.connect(name)
        except (ConnectionRefusedError, FileNotFoundError):
            return "stale"
        except OSError as exc:
            # Unsure (busy backlog, no permission): never delete what may be live.
            return f"could not probe it: {exc.strerror or exc}"
    return "live"


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """Serialize probe-unlink-bind among servers starting in one directory (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def live_server_at(path: str | os.PathLike[str]) -> bool:
    """Whether a server accepts connections on the Unix socket at ``path`` right now."""
    name = os.fspath(path)
    try:
        return probe(name) == "live"
    except OSError:  # a path too long for AF_UNIX, say
        return False


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_trusted_socket(path: str | os.PathLike[str], *, owner: int) -> None:
    """Refuse to talk to ``path`` unless it is a mode-0600 socket owned by user ``owner``.

    A host makes its socket exactly so. Anything else at the path (a file, a
    socket another user planted, one others may connect to) could take the
    request and answer it falsely, so it is refused with
    :class:`~streamkit.errors.UntrustedSocket` naming what was found;
    nothing is sent.
    """
    name = os.fspath(path)
    info = os.lstat(name)
    problems = []
    if not stat.S_ISSOCK(info.st_mode):
        problems.append("it is not a socket")
    if info.st_uid != owner:
        problems.append(f"it is owned by {_user(info.st_uid)}, not by {_user(owner)}")
    if info.st_mode & 0o077:
        problems.append(f"its mode is {stat.S_IMODE(info.st_mode):04o}, not 0600")
    if problems:
        raise UntrustedSocket(
            f"refusing the control socket {name!r}: {'; '.join(problems)}. A streamkit host "
            "creates its socket as a mode-0600 socket owned by the user who owns the "
            "database, so something else put this there; nothing was sent. Remove it (or "
            "point --socket at the real host's socket)",
            details={"path": name, "owner": info.st_uid, "expected_owner": owner},
        )


def check_private_directory(directory: Path, *, allow_shared: bool = False) -> None:
    """Refuse a socket directory that is missing, or where another user could replace the socket.

    The latter is a directory writable by group or others without the sticky
    bit (``/tmp`` has it: there only a file's owner may remove or rename it),
    or one owned by another user than this one or root; ``allow_shared``
    accepts it (only a missing directory is refused then).
    """
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        raise InvalidRequest(
            f"the control socket's directory {str(directory)!r} does not exist; create it or "
            "choose another socket path; nothing was created",
            details={"directory": str(directory)},
        ) from None
    if allow_shared:
        return
    me = os.geteuid()
    problems = []
    if info.st_uid not in (me, 0):
        problems.append(f"it is owned by {_user(info.st_uid)}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        problems.append(
            f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users create, replace and "
            "remove files there"
        )
    if problems:
        raise UntrustedSocket(
            f"refusing to create the control socket in {str(directory)!r}: {'; '.join(problems)}"
            ", so another user could swap the socket and receive what clients send; nothing "
            "was created. Put the socket in a directory only you can write (socket = ... in "
            "streamkit.toml or --socket), or accept the risk with shared_socket_dir = true "
            "(--shared-socket-dir)",
            details={"directory": str(directory), "owner": info.st_uid},
        )
