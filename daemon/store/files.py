"""Files under the state directory: atomic replacement, TinyDB storage served from memory,
corrupt files moved aside, and names for items that become files.

Every write goes through `atomic_write`: temp file in the same folder, flush, fsync,
`os.replace`, fsync of the folder. A crash leaves the old file or the new one, never half.

The record keepers reach their files only through a `Files` handed to them: `DiskFiles` is the
state directory (what the daemon uses), `MemoryFiles` keeps the same files as bytes in a dict,
so a test can run a whole `Store` with nothing written to disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any

from tinydb import TinyDB
from tinydb.storages import Storage

from daemon.core.errors import StoreError
from daemon.core.logs import store_log as log

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,80}")


class CorruptFile(StoreError):
    """A state file exists but does not hold valid JSON."""


def atomic_write(path: Path, payload: bytes, *, durable_rename: bool = True,
                 folder_owner: bool = False) -> None:
    """Replace `path` with `payload` so that a crash leaves either the old or the new bytes.

    `durable_rename=False` skips the folder's fsync (most of the write's time): a killed
    process loses nothing by it (the rename is in the kernel at once), but a power cut may
    bring the old bytes back. Only for writes where the old bytes are a safe answer too.
    `folder_owner`: written by root (a `sudo roost ...` command beside the system service), the
    file gets its folder's owner, so that the service's own user can still replace it.
    """
    # Unique per call: two threads replacing one file must not share (and delete) a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
            if folder_owner and os.geteuid() == 0:
                owner = path.parent.stat()
                if owner.st_uid != 0:
                    os.fchown(handle.fileno(), owner.st_uid, owner.st_gid)
        os.replace(tmp, path)
        if durable_rename:  # the rename is durable only once the folder entry is on disk
            sync_folder(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc


def sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dumps(data: object) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def read_json(path: Path) -> Any:
    """The parsed file, None when it does not exist; `CorruptFile` when it does not parse
    (also when it is nested too deeply for Python's parser: no file can stop a start)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_json(path, raw)


def parse_json(path: Path, raw: bytes) -> Any:
    if not raw.strip():
        raise CorruptFile(f"{path} is empty")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptFile(f"{path}: {exc}") from exc


class AtomicJSONStorage(Storage):
    """TinyDB storage: UTF-8 JSON replaced atomically on every write, and read from disk once.

    roost is the only writer of its state directory (it holds the lock), so after the first
    read the parsed data is kept and served from memory; TinyDB would otherwise parse the whole
    file again for every query. A failed write drops the copy, since TinyDB may have changed
    it in place before writing: the next read goes back to what is on disk.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._data: dict[str, dict[str, Any]] | None = None

    def read(self) -> dict[str, dict[str, Any]] | None:
        if self._data is None:
            data = read_json(self.path)
            if data is not None and not isinstance(data, dict):
                raise CorruptFile(f"{self.path}: top level is not an object")
            self._data = data
        return self._data

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        try:
            atomic_write(self.path, dumps(data))
        except StoreError:
            self._data = None
            raise
        self._data = data

    def close(self) -> None:
        self._data = None


class FollowingJSONStorage(AtomicJSONStorage):
    """TinyDB storage for a reader in another process than the file's writer (a command while
    the daemon runs): the copy is kept only while the file on disk is the one it was read from.
    Every write replaces the file (a rename), so a new inode, size or mtime means new data."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._seen: tuple[int, int, int] | None = None

    def read(self) -> dict[str, dict[str, Any]] | None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            seen = None
        else:
            seen = (info.st_ino, info.st_size, info.st_mtime_ns)
        if seen != self._seen:
            self._data = None
            self._seen = seen
        return super().read()


def file_name(item_id: str) -> str:
    """A file name for an item id: the id itself when it is tame, else a digest of it."""
    if _SAFE_NAME.fullmatch(item_id) and not item_id.startswith("."):
        return item_id.replace(":", "_")
    return "h-" + hashlib.sha256(item_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def move_aside(path: Path, reason: str, consequence: str) -> Path:
    """Keep a corrupt file under a new name (never deleted), logging where it went."""
    target = corrupt_name(path, Path.exists)
    os.replace(path, target)
    log.error("corrupt state file %s moved aside to %s (%s); %s",
              path, target.name, reason, consequence)
    return target


def remove_stale_temp_files(state_dir: Path) -> None:
    """Temp files of writes a crash interrupted; the real files are intact without them."""
    for stale in state_dir.glob("**/.*.tmp"):
        stale.unlink(missing_ok=True)


def corrupt_name(path: Path, taken: Callable[[Path], bool]) -> Path:
    """Where a corrupt file is kept: a name no earlier corrupt copy has."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while taken(target):  # never overwrite an earlier corrupt copy
        counter += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
    return target


class Files:
    """The files of one state directory, as the record keepers use them. Paths are absolute,
    under `root`; a missing file reads as None and lists as nothing."""

    root: Path

    def db(self, path: Path) -> TinyDB:
        """A TinyDB database kept in `path`, read once and then served from memory."""
        raise NotImplementedError

    def read_bytes(self, path: Path) -> bytes:
        """The file's bytes; `FileNotFoundError` when there is none (`OSError` on disk)."""
        raise NotImplementedError

    def write(self, path: Path, payload: bytes, *, durable_rename: bool = True) -> None:
        """Replace the file atomically (see `atomic_write`); `StoreError` when it fails."""
        raise NotImplementedError

    def remove(self, path: Path) -> None:
        """Remove the file if it is there; `StoreError` when that fails."""
        raise NotImplementedError

    def replace(self, source: Path, target: Path) -> None:
        raise NotImplementedError

    def size(self, path: Path) -> int | None:
        """The file's size in bytes, None when there is no such file."""
        raise NotImplementedError

    def glob(self, folder: Path, pattern: str) -> list[Path]:
        """Files under `folder` whose path relative to it matches `pattern`, sorted."""
        raise NotImplementedError

    def mkdir(self, folder: Path) -> None:
        raise NotImplementedError

    def remove_stale_temp_files(self) -> None:
        """Temp files of writes a crash interrupted; the real files are intact without them."""

    def exists(self, path: Path) -> bool:
        return self.size(path) is not None

    def read_json(self, path: Path) -> Any:
        """As `read_json`, for a file of these."""
        try:
            raw = self.read_bytes(path)
        except FileNotFoundError:
            return None
        return parse_json(path, raw)

    def move_aside(self, path: Path, reason: str, consequence: str) -> Path:
        """Keep a corrupt file under a new name (never deleted), logging where it went."""
        target = corrupt_name(path, self.exists)
        self.replace(path, target)
        log.error("corrupt state file %s moved aside to %s (%s); %s",
                  path, target.name, reason, consequence)
        return target


class DiskFiles(Files):
    """The state directory on disk, every write atomic and durable (see `atomic_write`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def db(self, path: Path) -> TinyDB:
        return TinyDB(path, storage=AtomicJSONStorage)

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def write(self, path: Path, payload: bytes, *, durable_rename: bool = True) -> None:
        atomic_write(path, payload, durable_rename=durable_rename)

    def remove(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot remove {path}: {exc.strerror or exc}") from exc

    def replace(self, source: Path, target: Path) -> None:
        os.replace(source, target)

    def size(self, path: Path) -> int | None:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return None

    def glob(self, folder: Path, pattern: str) -> list[Path]:
        return sorted(folder.glob(pattern))

    def mkdir(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)

    def remove_stale_temp_files(self) -> None:
        remove_stale_temp_files(self.root)

    def move_aside(self, path: Path, reason: str, consequence: str) -> Path:
        return move_aside(path, reason, consequence)


class MemoryFiles(Files):
    """The same files as bytes in a dict: for tests, a state directory that never touches the
    disk. Bytes are what `DiskFiles` would write, so sizes (segment limits) behave alike, and
    a second `Store` over the same `MemoryFiles` finds what the first left, as after a restart.
    `root` only names the files; nothing is created there."""

    def __init__(self, root: Path = Path("/roost-in-memory")) -> None:
        self.root = root
        self.files: dict[Path, bytes] = {}

    def db(self, path: Path) -> TinyDB:
        return TinyDB(self, path, storage=FilesStorage)

    def read_bytes(self, path: Path) -> bytes:
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    def write(self, path: Path, payload: bytes, *, durable_rename: bool = True) -> None:
        self.files[path] = payload

    def remove(self, path: Path) -> None:
        self.files.pop(path, None)

    def replace(self, source: Path, target: Path) -> None:
        self.files[target] = self.read_bytes(source)
        del self.files[source]

    def size(self, path: Path) -> int | None:
        found = self.files.get(path)
        return None if found is None else len(found)

    def glob(self, folder: Path, pattern: str) -> list[Path]:
        depth = len(PurePath(pattern).parts)
        return sorted(p for p in self.files if p.is_relative_to(folder)
                      and len(p.relative_to(folder).parts) == depth
                      and p.relative_to(folder).match(pattern))

    def mkdir(self, folder: Path) -> None:
        """Folders are implied by the files in them."""


class FilesStorage(Storage):
    """TinyDB storage on a `Files` (the in-memory one): read once, then served from memory,
    like `AtomicJSONStorage`, whose disk behaviour it leaves alone."""

    def __init__(self, files: Files, path: Path) -> None:
        self.files = files
        self.path = path
        self._data: dict[str, dict[str, Any]] | None = None

    def read(self) -> dict[str, dict[str, Any]] | None:
        if self._data is None:
            data = self.files.read_json(self.path)
            if data is not None and not isinstance(data, dict):
                raise CorruptFile(f"{self.path}: top level is not an object")
            self._data = data
        return self._data

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        try:
            self.files.write(self.path, dumps(data))
        except StoreError:
            self._data = None
            raise
        self._data = data

    def close(self) -> None:
        self._data = None


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an flock on `lock_path` (made 0600 when missing), so that roost's commands and the
    daemon change a shared file one at a time. Made by root (a command run with sudo next to
    the system service), it is given the owner of its folder, or the service could not take
    it any more."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        owner = lock_path.parent.stat()
        if os.geteuid() == 0 and owner.st_uid != 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
    except OSError as exc:
        raise StoreError(f"cannot use {lock_path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
