"""Files written whole or not at all: every file memlab_rs saves goes through ``atomic_open``.

Saving used to truncate the target and write in place, so a full disk, a quota, a size
limit, a SIGKILL or a power cut in the middle destroyed the good file that was there and
left a truncated one. Here the bytes go to a new file in the target's folder (so the rename
stays on one filesystem), which is flushed and fsync'ed, then renamed over the target
(atomic on POSIX) and the folder fsync'ed so the rename outlives a crash. A reader sees
the old file or the new one, never a mix; a failed write leaves the old file as it was and
removes the new one.

The new file is ``.<name>.<pid>.<random>.tmp`` beside the target: only a process killed
mid-write (SIGKILL, a power cut) can leave one behind. It gets the target's permission bits
when the target exists (the usual ``0666 & ~umask`` when not). A symlink is written through,
as ``open`` would (the link stays a link); a target that is not a regular file (a
terminal, a pipe, ``/dev/null``) is written directly: there is nothing there to keep.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "out.txt")
>>> with atomic_open(path) as f:
...     _ = f.write("all or nothing")
>>> open(path).read()
'all or nothing'
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], binary: bool = False, newline: str | None = None
) -> Iterator[IO[Any]]:
    """A file to write ``path``'s new content to (text in UTF-8, or ``binary``): it replaces
    ``path`` when the ``with`` block ends without an exception, and is removed otherwise."""
    asked = os.fspath(path)
    try:  # following links, /proc's too: /dev/stdout may be a pipe
        existing: os.stat_result | None = os.stat(asked)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        with _opened(os.open(asked, os.O_WRONLY | os.O_TRUNC), binary, newline) as f:
            yield f
        return
    target = os.path.realpath(asked)
    folder, name = os.path.split(target)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as error:  # name the file asked for, not ours
        raise type(error)(
            error.errno,
            f"{error.strerror} (memlab_rs writes a new file in the folder, then renames it "
            "over the old one)",
            target,
        ) from None
    try:
        if existing is not None:
            os.fchmod(fd, stat.S_IMODE(existing.st_mode))
        with _opened(fd, binary, newline) as f:
            fd = -1  # the file object owns it now
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        if fd != -1:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_folder(folder)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    with atomic_open(path, binary=True) as f:
        f.write(data)


def write_text(path: str | os.PathLike[str], text: str, newline: str | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    with atomic_open(path, newline=newline) as f:
        f.write(text)


def save_figure(fig: Any, path: Any, dpi: Any = "figure") -> None:
    """``fig.savefig(path)``, whole or not at all: the format is the extension's, and a name
    without one gets matplotlib's default (``.png``), as savefig names it. (Here, below the
    rooms, since every room that draws a matplotlib figure saves it so: the trace's plots,
    the monitor's.)"""
    import matplotlib

    name = os.fspath(path)
    extension = os.path.splitext(name)[1][1:].lower()
    if not extension:
        extension = matplotlib.rcParams["savefig.format"]
        name = f"{name}.{extension}"
    with atomic_open(name, binary=True) as f:
        fig.savefig(f, dpi=dpi, format=extension)


def _opened(fd: int, binary: bool, newline: str | None) -> IO[Any]:
    if binary:
        return os.fdopen(fd, "wb")
    return os.fdopen(fd, "w", encoding="utf-8", newline=newline)


def _fsync_folder(folder: str) -> None:
    """Make the rename durable; a filesystem that cannot sync a folder keeps it anyway."""
    try:
        fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
