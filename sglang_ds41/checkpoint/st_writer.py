"""Write safetensors files in pieces, published atomically.

`safetensors.save_file` needs every tensor in memory; an Engram table is 101 GB. The format is
simple enough to stream: 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
``data_offsets`` relative to the end of the header, ``__metadata__`` first) padded with spaces to
a multiple of 8, then the raw bytes. We lay the header out like safetensors does (compact JSON,
tensors in data order), so a streamed file equals the one `save_file` writes for the same tensors.

A `PartialFile` lives under ``<final>.partial`` until `commit` has fsync'd it and renamed it into
place, so a killed or failed run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_ds41.errors import Ds41Error

PARTIAL_SUFFIX = ".partial"
_ALIGN = 8

# safetensors' dtype enum order: `save_file` lays tensors out by dtype, highest first, then name.
# (Checked against safetensors 0.8 for every dtype torch can save; F4/F6/C64 follow its source.)
_DTYPE_ORDER = (
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
)  # fmt: skip

# The write seam: tests inject failures (ENOSPC, EROFS) here without a real full disk.
PWrite = Callable[[int, bytes | memoryview, int], int]


# copy_file_range's answers for "not between these files": fall back to read + write.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF})


class OutputError(Ds41Error):
    """Writing the output failed: disk full, read-only target, permissions, I/O error."""


@dataclass(frozen=True)
class HeaderEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def canonical_order(entries: Sequence[HeaderEntry]) -> list[HeaderEntry]:
    """`save_file`'s data order, so a streamed file is byte-identical to the one it would write."""
    rank = {d: i for i, d in enumerate(_DTYPE_ORDER)}
    return sorted(entries, key=lambda e: (-rank.get(e.dtype, -1), e.name))


def build_header(
    entries: Sequence[HeaderEntry], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[int]]:
    """(the file's first bytes: length prefix + padded JSON, data offset of each entry)."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offsets, pos = [], 0
    for e in entries:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [pos, pos + e.nbytes]}
        offsets.append(pos)
        pos += e.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw, offsets


def describe_os_error(error: OSError, path: Path, needed: int | None = None) -> str:
    """One line naming the file and, for a full disk, the bytes still needed and free."""
    if error.errno == errno.ENOSPC:
        free = free_bytes(path.parent)
        need = f"; {needed:,} more bytes needed" if needed is not None else ""
        return f"disk full while writing {path}{need}, {free:,} bytes free on {path.parent}"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path}: {error.strerror} (read-only or not writable target)"
    return f"cannot write {path}: {error.strerror or error}"


def free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartialFile:
    """`size` bytes written at any offsets into ``<final>.partial``, renamed to `final` on commit.

    Any OSError becomes an `OutputError` naming the file (and, for ENOSPC, the bytes still
    needed); the partial file is deleted first, so failures leave nothing behind."""

    def __init__(self, final: Path, size: int, pwrite: PWrite = os.pwrite, needed_after: int = 0):
        self.final = final
        self.path = final.with_name(final.name + PARTIAL_SUFFIX)
        self.size = size
        self.written = 0
        self._pwrite = pwrite
        self._needed_after = needed_after  # bytes the rest of the job writes after this file
        self._fd: int | None = None
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as error:
            raise OutputError(describe_os_error(error, self.path, size + needed_after)) from None

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                n = self._pwrite(self._fd, view, offset)
                view, offset, self.written = view[n:], offset + n, self.written + n
        except OSError as error:
            self._fail(error)

    def copy_from(self, src_fd: int, src_offset: int, offset: int, nbytes: int) -> int:
        """Copy bytes of another file in the kernel; returns how many were copied.

        `os.copy_file_range` never brings the bytes into this process (and shares extents on
        filesystems that reflink), so copying the checkpoint's untouched tensors costs what a
        plain ``cp`` costs. Fewer than `nbytes` come back when the source ends early, when the
        kernel cannot copy between these two files, or when an injected `pwrite` must see
        every write (tests): the caller writes the rest through `write_at`."""
        if self._pwrite is not os.pwrite:
            return 0
        done = 0
        try:
            while done < nbytes:
                n = os.copy_file_range(src_fd, self._fd, nbytes - done, src_offset + done, offset + done)
                if n == 0:
                    break
                done += n
        except OSError as error:
            if error.errno not in _NO_KERNEL_COPY:
                self._fail(error)
        self.written += done
        return done

    def commit(self) -> None:
        """fsync, close, rename into place, fsync the directory (the rename is durable too)."""
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            os.replace(self.path, self.final)
            fsync_dir(self.final.parent)
        except OSError as error:
            self._fail(error)

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.unlink(missing_ok=True)

    def _fail(self, error: OSError):
        needed = max(self.size - self.written, 0) + self._needed_after
        self.discard()
        raise OutputError(describe_os_error(error, self.final, needed)) from None

    def __enter__(self) -> PartialFile:
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None or exc[0] is not None:
            self.discard()


def write_bytes_atomic(final: Path, data: bytes, pwrite: PWrite = os.pwrite) -> None:
    """A small file (JSON, a copied tokenizer) written whole and renamed into place."""
    with PartialFile(final, len(data), pwrite) as f:
        f.write_at(0, data)
        f.commit()
