"""Reading the source checkpoint: table rows and tensor bytes with ``pread`` into reused buffers
(a memory map would keep every touched page resident, i.e. RSS = table size)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sglang_ds41.checkpoint.convert.errors import ConvertError
from sglang_ds41.checkpoint.reader import StoredTensor

if TYPE_CHECKING:
    from sglang_ds41.checkpoint.convert.plan import Table


class Sources:
    """Open source shards; reads go into buffers that are reused, so RSS stays bounded."""

    def __init__(self, root: Path):
        self.root = root
        self._fds: dict[str, int] = {}

    def fd(self, file: str) -> int:
        if file not in self._fds:
            try:
                self._fds[file] = os.open(self.root / file, os.O_RDONLY)
            except OSError as error:
                raise ConvertError(f"cannot read source shard {self.root / file}: {error.strerror}") from None
        return self._fds[file]

    def read_into(self, file: str, offset: int, view: memoryview) -> None:
        fd = self.fd(file)
        try:
            while view:
                n = os.preadv(fd, [view], offset)
                if n == 0:
                    raise ConvertError(f"source shard {self.root / file} ended early at byte {offset}")
                view, offset = view[n:], offset + n
        except OSError as error:
            raise ConvertError(f"cannot read source shard {self.root / file}: {error.strerror}") from None

    def part(self, stored: StoredTensor, rows: int, start: int, stop: int) -> np.ndarray:
        """Bytes of rows [start, stop) of a `rows`-row tensor as uint8 [n, bytes per row]."""
        per_row = (stored.end - stored.start) // rows
        buf = np.empty((stop - start, per_row), np.uint8)
        self.read_into(stored.file, stored.start + start * per_row, memoryview(buf).cast("B"))
        return buf

    def rows(self, t: Table, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Source weight and scale bytes of rows [start, stop) as uint8 [n, bytes per row]."""
        return self.part(t.weight, t.rows, start, stop), self.part(t.scale, t.rows, start, stop)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
