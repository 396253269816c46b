"""Named shared-memory segments in /dev/shm, owned by the process that creates them.

The creator removes the name when the object is closed, garbage collected, or the
interpreter exits (also by an exception or Ctrl-C). A creator killed outright (SIGKILL)
cannot clean up; its segments carry its pid in their name, and the next segment created
on the machine removes those whose creator is gone.

`multiprocessing.shared_memory` is not used because, before Python 3.13, every process
that attaches registers the segment with a resource tracker that unlinks it when that
process exits, which breaks segments shared with short-lived workers.
"""
from __future__ import annotations

import atexit
import ctypes
import errno
import mmap
import multiprocessing.util
import os
import secrets
import weakref

from ._rq import ffi

SHM_DIR = "/dev/shm"
PREFIX = "rq-"


class SegmentGone(FileNotFoundError):
    """The segment's name no longer exists: its creator closed it or exited."""


class SharedMemoryFull(OSError):
    """/dev/shm has no room for a new segment (errno ENOSPC)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_segments() -> list[str]:
    """Remove segments left by creators that no longer exist; return their names."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) == 3 and parts[1].isdigit():
            if not _pid_alive(int(parts[1])):
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                    removed.append(name)
                except FileNotFoundError:
                    pass  # another process removed it first
    return removed


# Names this process created and has not removed yet: path -> creator pid. A forked
# child inherits the table, and the pid check keeps it from removing its parent's names.
_OWNED: dict[str, int] = {}


def _unlink(path: str) -> None:
    if _OWNED.get(path) == os.getpid() and _OWNED.pop(path, None) is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@atexit.register
def _unlink_all() -> None:
    # Only the names: a daemon thread may still be inside a C call on the mapping.
    for path in list(_OWNED):
        _unlink(path)


def _release(buffer, mapping, path: str) -> None:
    """Finalizer on garbage collection: unmap, and remove the name if we created it."""
    ffi.release(buffer)
    try:
        mapping.close()
    except BufferError:
        pass  # views of it are still alive (Segment.view): it is unmapped with the last one
    _unlink(path)


def _reserve(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        stat = os.statvfs(SHM_DIR)
        raise SharedMemoryFull(
            errno.ENOSPC, f"{SHM_DIR} has no room for {size:,} bytes of shared memory "
            f"({stat.f_bavail * stat.f_frsize:,} of {stat.f_blocks * stat.f_frsize:,} free); make "
            f"the records or capacities smaller, or {SHM_DIR} larger (a container's: docker run "
            "--shm-size)") from None


class Segment:
    """A mapped segment. `address` is a cffi pointer to its first byte."""

    def __init__(self, name: str, size: int, create: bool):
        self.name = name
        self.size = size
        self.owner = create
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            raise SegmentGone(
                f"shared memory {name!r} no longer exists: the process that created it "
                "closed it or exited"
            ) from None
        try:
            if create:
                # Reserve the pages now: a full /dev/shm then fails here with ENOSPC
                # instead of killing a writer with SIGBUS later.
                _reserve(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"shared memory {name!r} is smaller than expected")
            mapping = mmap.mmap(fd, size)
        except BaseException:
            if create:
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.address = ffi.from_buffer(mapping)
        self._mapping = mapping
        self._path = path
        if create:
            _OWNED[path] = os.getpid()
            # A multiprocessing child ends with os._exit, which skips atexit; its exit
            # hook runs these finalizers instead.
            multiprocessing.util.Finalize(None, _unlink, args=(path,), exitpriority=0)
        weakref.finalize(self, _release, self.address, mapping, path).atexit = False

    @classmethod
    def create(cls, size: int) -> Segment:
        remove_stale_segments()
        return cls(f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}", size, create=True)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        return cls(name, size, create=False)

    def view(self, offset: int, size: int):
        """Bytes [offset, offset + size) of the segment, as a buffer that keeps the mapping
        alive for as long as it, or an array made on it, lives. (A ctypes array: numpy
        keeps it as the array's base, where of a memoryview it would keep only the mmap,
        which the finalizer could then unmap under the array.)"""
        return (ctypes.c_char * size).from_buffer(self._mapping, offset)

    def unlink(self) -> None:
        """Remove the name (creator only); mappings stay valid until released."""
        _unlink(self._path)
