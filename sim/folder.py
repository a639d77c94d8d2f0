"""A run's output folder: never delete what clustersim did not make.

A folder clustersim writes holds a marker file, MARKER. A run may replace only a folder that
does not exist yet or that holds the marker (a previous run's); anything else (a user's folder,
`.`, a file) is refused before the simulation starts. The outputs are written into a fresh hidden
sibling and swapped into place at the end, so a folder is complete or absent, never half; a lock
beside it (`flock`, released by the kernel if the process dies) lets one of two concurrent runs
into the same folder win and tells the other so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; concurrent runs are not guarded there
    fcntl = None  # type: ignore[assignment]

MARKER = ".clustersim-run"


class OutputError(Exception):
    """An output folder clustersim must not or cannot write. str(err) is one line naming it."""

    def __init__(self, folder: str | Path, reason: str):
        super().__init__(f"{folder}: {reason}")


def version() -> str:
    """The installed clustersim's version (what a run folder's marker records)."""
    return metadata.version("clustersim")


def check_target(folder: str | Path) -> Path:
    """The folder, if a run may write it: absent (with a writable first existing ancestor) or a
    previous run's; else OutputError saying why and what to do. Writes nothing."""
    folder = Path(folder)
    if "\0" in str(folder):
        raise OutputError(repr(str(folder))[1:-1], "a path cannot hold a NUL byte")
    if len(folder.name.encode()) > 255:
        raise OutputError(str(folder)[:80] + "...", "a folder name is at most 255 bytes")
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or folder.is_symlink():
            raise OutputError(folder, "exists and is not a folder; choose another output folder (-o)")
        if not (folder / MARKER).is_file():
            raise OutputError(
                folder,
                f"exists and is not a clustersim run folder (it has no {MARKER}); clustersim never deletes "
                "what it did not write: choose another output folder (-o) or empty this one yourself",
            )
    ancestor = folder.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(folder, f"cannot be made: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(folder, f"cannot be written: {ancestor} is not writable")
    return folder


@contextmanager
def locked(folder: str | Path) -> Iterator[None]:
    """Hold the lock of `folder` (a hidden file beside it, removed at the end): a second run into
    the same folder meanwhile gets an OutputError at once."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f".{folder.name}.lock"
    with open(lock_path, "w") as lock:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(folder, "another clustersim run is writing this folder") from None
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)


def write_marker(folder: Path, kind: str) -> None:
    """Mark `folder` as clustersim's: the version that wrote it and what kind of output it holds."""
    (folder / MARKER).write_text(json.dumps({"clustersim": version(), "kind": kind}) + "\n")


@contextmanager
def resumable_folder(folder: str | Path, kind: str) -> Iterator[Path]:
    """A folder written in place as work finishes, so an interrupted command resumes from what is
    in it (`clustersim plan`, `sweep`): checked as any run folder (absent or clustersim's, never
    a user's), made and marked at once, locked against a second writer while the block runs.
    Files clustersim wrote earlier stay; nothing is ever deleted."""
    folder = check_target(folder)
    with locked(folder):
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / MARKER).is_file():
            write_marker(folder, kind)
        yield folder


@contextmanager
def output_folder(folder: str | Path, kind: str = "run") -> Iterator[Path]:
    """A fresh hidden sibling of `folder` to write into; when the block ends it gets the marker and
    takes the folder's place (a previous run's folder is moved aside first, then removed); if the
    block raises, the sibling is removed and `folder` is left as it was."""
    folder = check_target(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield tmp
        write_marker(tmp, kind)
        old = None
        if folder.exists():
            check_target(folder)  # still a previous run's (nobody swapped in a folder of their own meanwhile)
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            folder.rename(old / folder.name)
        tmp.rename(folder)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Terminated(BaseException):
    """SIGTERM as an exception, so the folders being written are cleaned up as for Ctrl-C."""


def terminated(signum: int, frame: object) -> None:
    raise Terminated
