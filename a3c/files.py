"""Writing files so that a crash never leaves a half-written one under the real name, and
quoting errors in one-line reports."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call `write` on a temporary file in the same folder, flush it to disk, then rename
    it to `path` (creating the folder if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600, as a plain open() would make it
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, which races other
    threads' file creation); 0o022 where the kernel does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def excerpt(error: BaseException, limit: int = 160) -> str:
    """An error's message for a one-line report: its first line, cut at a word with an
    ellipsis when longer than `limit`, so that the sentence around it still reads whole."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
