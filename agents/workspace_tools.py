"""File tools confined to one workspace directory. There is deliberately no shell tool.

Confinement does not rely on checking a resolved path and then opening it (a symlink swapped
in between would escape). Every path is opened component by component from a descriptor of the
root with `O_NOFOLLOW` (`openat`), so `..`, absolute paths and symlinks at *any* level are
refused, not followed, even if the tree changes while the tool runs. Only regular files are read
or written (a FIFO or device is refused without waiting on it). Reads and writes are size
limited, and a refused write leaves the file as it was. Deleting needs approval.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath

from .errors import AgentConfigError
from .tools import Tool, function_tool


class WorkspaceError(Exception):
    """A refused file operation; its message goes back to the model as the tool result."""


class Workspace:
    def __init__(
        self, root: str | os.PathLike[str], *, max_file_bytes: int = 1 << 20, max_entries: int = 500
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise AgentConfigError(f"workspace root {root} is not a directory")
        self.max_file_bytes, self.max_entries = max_file_bytes, max_entries

    def parts(self, path: str) -> list[str]:
        if not path or "\x00" in path:
            raise WorkspaceError(f"path {path!r}: expected a non-empty path without NUL characters")
        pure = PurePosixPath(path)
        if pure.is_absolute() or path.startswith("~") or "\\" in path:
            raise WorkspaceError(f"{path!r}: use a path relative to the workspace root")
        parts = [p for p in pure.parts if p != "."]
        if ".." in parts:
            raise WorkspaceError(f"{path!r}: '..' is not allowed (paths stay inside the workspace)")
        return parts

    def _dir_fd(self, parts: list[str], create: bool = False) -> int:
        """An fd of the directory `parts` under the root, never following a symlink."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                try:
                    next_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    raise WorkspaceError(f"no such directory: {name!r}") from None
                except (NotADirectoryError, OSError) as error:
                    raise WorkspaceError(
                        f"{name!r} is not a directory inside the workspace (symlinks are not followed)"
                    ) from error
                os.close(fd)
                fd = next_fd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_file(self, path: str, flags: int, create_dirs: bool = False) -> int:
        parts = self.parts(path)
        if not parts:
            raise WorkspaceError(f"{path!r} is the workspace root, not a file")
        dir_fd = self._dir_fd(parts[:-1], create=create_dirs)
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        except FileNotFoundError:
            raise WorkspaceError(f"no such file: {path!r}") from None
        except OSError as error:
            raise WorkspaceError(
                f"cannot open {path!r}: not a regular file inside the workspace "
                f"(symlinks are not followed) [{error.strerror}]"
            ) from None
        finally:
            os.close(dir_fd)

    def read(self, path: str) -> str:
        # O_NONBLOCK: opening a FIFO planted in the tree returns at once instead of waiting for a
        # writer, and is then refused as not a regular file.
        fd = self._open_file(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            self._regular(path, handle.fileno())
            size = os.fstat(handle.fileno()).st_size
            if size > self.max_file_bytes:
                raise WorkspaceError(f"{path!r} has {size} bytes; the limit is {self.max_file_bytes}")
            return handle.read(self.max_file_bytes + 1).decode("utf-8", errors="replace")

    def write(self, path: str, content: str, append: bool = False) -> str:
        """Every check runs before a byte of the file changes: a refused write (too large, not a
        regular file) leaves an existing file as it was and creates none."""
        data = content.encode()
        if len(data) > self.max_file_bytes:
            raise WorkspaceError(self._too_large(path, len(data)))
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | (os.O_APPEND if append else 0)
        fd = self._open_file(path, flags, create_dirs=True)
        with os.fdopen(fd, "ab" if append else "wb") as handle:  # "wb" on an fd does not truncate
            self._regular(path, handle.fileno())
            size = os.fstat(handle.fileno()).st_size if append else 0
            if size + len(data) > self.max_file_bytes:
                raise WorkspaceError(self._too_large(path, size + len(data)))
            if not append:
                os.ftruncate(handle.fileno(), 0)
            handle.write(data)
        return f"wrote {len(data)} bytes to {path}"

    def _too_large(self, path: str, size: int) -> str:
        return f"{path!r} would have {size} bytes; the limit is {self.max_file_bytes}"

    @staticmethod
    def _regular(path: str, fd: int) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WorkspaceError(f"{path!r} is not a regular file")

    def listing(self, path: str) -> str:
        fd = self._dir_fd(self.parts(path))
        try:  # entries stat through the directory fd, so describe them before closing it
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
            lines = [_describe(entry) for entry in entries[: self.max_entries]]
        finally:
            os.close(fd)
        if len(entries) > self.max_entries:
            lines.append(f"... and {len(entries) - self.max_entries} more entries")
        return "\n".join(lines) or "(empty directory)"

    def delete(self, path: str) -> str:
        parts = self.parts(path)
        if not parts:
            raise WorkspaceError("cannot delete the workspace root")
        dir_fd = self._dir_fd(parts[:-1])
        try:
            os.unlink(parts[-1], dir_fd=dir_fd)  # unlinks a symlink itself, never its target
        except FileNotFoundError:
            raise WorkspaceError(f"no such file: {path!r}") from None
        except IsADirectoryError:
            raise WorkspaceError(f"{path!r} is a directory; only files can be deleted") from None
        finally:
            os.close(dir_fd)
        return f"deleted {path}"


def _describe(entry: os.DirEntry[str]) -> str:
    name = os.fsencode(entry.name).decode("utf-8", "backslashreplace")  # bytes that are not UTF-8 as \xff
    if entry.is_symlink():
        return f"{name} (symlink, not followed)"
    if entry.is_dir(follow_symlinks=False):
        return f"{name}/"
    return f"{name} ({entry.stat(follow_symlinks=False).st_size} bytes)"


def workspace_tools(
    root: str | os.PathLike[str], *, writable: bool = True, max_file_bytes: int = 1 << 20
) -> list[Tool]:
    """`list_dir`, `read_file` and, if `writable`, `write_file`, `append_file`, `delete_file`
    (the last one needs approval)."""
    ws = Workspace(root, max_file_bytes=max_file_bytes)

    def list_dir(path: str = ".") -> str:
        """List a directory of the workspace.

        Args:
            path: Directory relative to the workspace root.
        """
        return ws.listing(path)

    def read_file(path: str) -> str:
        """Read a UTF-8 text file of the workspace.

        Args:
            path: File path relative to the workspace root.
        """
        return ws.read(path)

    def write_file(path: str, content: str) -> str:
        """Create or overwrite a text file in the workspace (missing directories are created).

        Args:
            path: File path relative to the workspace root.
            content: The complete new file content.
        """
        return ws.write(path, content)

    def append_file(path: str, content: str) -> str:
        """Append text to a file in the workspace (created if missing).

        Args:
            path: File path relative to the workspace root.
            content: Text to add at the end.
        """
        return ws.write(path, content, append=True)

    def delete_file(path: str) -> str:
        """Delete one file of the workspace.

        Args:
            path: File path relative to the workspace root.
        """
        return ws.delete(path)

    tools = [function_tool(list_dir), function_tool(read_file)]
    if writable:
        tools += [
            function_tool(write_file),
            function_tool(append_file),
            function_tool(delete_file, needs_approval=True),
        ]
    return tools
