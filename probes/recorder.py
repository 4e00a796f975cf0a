"""The watcher's flight recorder: a bounded ring of window records on disk, crash-safe.

Why this shape: the watcher runs for months as root and may be killed at any
byte, on a disk that fills up. So the ring is a directory of append-only
segments (NNNNNNNNNNNN.seg); each record is MAGIC, payload length, CRC-32 of
the payload, then the payload: a head (what a listing needs) and a body
(the rest, decoded only when asked), each zlib-compressed JSON. A record is appended in
one write and fdatasync'ed; a write that fails (a full disk) is cut back to
where it began (tune.files.append). A reader checks length and checksum and
drops what fails them (a torn tail after kill -9, a flipped byte) and looks
for the next MAGIC whose record checks: nothing is ever misread. A writer
never appends after a tail it did not write: each run starts a new segment.
When the ring would pass its cap, the oldest segments go.

One writer per directory: a flock on its `lock` file (the kernel drops it
however the holder dies); a second watcher is refused, naming the first.
Every file is opened relative to the vetted directory's fd, O_NOFOLLOW,
and must be a plain file of ours (tune.files).
"""

import fcntl
import json
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from proxytune.core.errors import ProxytuneError
from proxytune.core.numbers import is_uint
from proxytune.tune import files

MAGIC = b"\xa5PTw"
HEADER = struct.Struct(">4sII")          # magic, payload length, crc32(payload)
HEAD_LEN = struct.Struct(">I")           # the payload starts with its head's length
MAX_RECORD = 16 << 20                    # a longer length field is corruption, not a record
DEFAULT_CAP = 256 << 20
MIN_CAP = 64 << 10
SEGMENTS = 16                            # the cap is spent in about this many segments
SEGMENT_RE = re.compile(r"(\d{12})\.seg")
LOCK = "lock"


def encode(record: dict) -> bytes:
    """One record as it is stored: header, then the payload: the head's length, the head, and the
    record's `body`, which a reader decodes only when asked (each compressed JSON)."""
    head = {k: v for k, v in record.items() if k != "body"}
    hb = zlib.compress(json.dumps(head, separators=(",", ":"), default=str).encode(), 6)
    body = record.get("body")
    bb = zlib.compress(json.dumps(body, separators=(",", ":"), default=str).encode(), 6) if body is not None else b""
    payload = HEAD_LEN.pack(len(hb)) + hb + bb
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_at(buf: bytes, pos: int, whole: bool = True) -> tuple[dict | None, int]:
    """(record, end) when a whole, intact record starts at pos; (None, pos) otherwise. Without
    `whole`, the body is checked (CRC) but not decoded: the head says where it is (`_at`)."""
    if len(buf) - pos < HEADER.size:
        return None, pos
    magic, size, crc = HEADER.unpack_from(buf, pos)
    end = pos + HEADER.size + size
    if magic != MAGIC or not HEAD_LEN.size <= size <= MAX_RECORD or end > len(buf):
        return None, pos
    payload = memoryview(buf)[pos + HEADER.size:end]
    if zlib.crc32(payload) != crc:
        return None, pos
    (n,) = HEAD_LEN.unpack_from(payload)
    try:
        record = json.loads(zlib.decompress(payload[HEAD_LEN.size:HEAD_LEN.size + n]))
        if not isinstance(record, dict):
            return None, pos
        rest = payload[HEAD_LEN.size + n:]
        if whole and len(rest):
            record["body"] = json.loads(zlib.decompress(rest))
        elif not whole:
            record["_at"] = pos
    except (zlib.error, ValueError):
        return None, pos
    return record, end


@dataclass
class Scan:
    """What a read of one segment found: its intact records and the bytes it had to drop."""
    records: list[dict] = field(default_factory=list)
    dropped_bytes: int = 0
    damaged: bool = False


def scan(buf: bytes, whole: bool = True) -> Scan:
    """Every intact record in a segment's bytes, in order; damage is skipped to the next MAGIC
    that starts an intact record (a torn tail simply ends the segment). Without `whole`, heads only."""
    out, pos = Scan(), 0
    while pos < len(buf):
        record, end = decode_at(buf, pos, whole)
        if record is not None:
            out.records.append(record)
            pos = end
            continue
        nxt = buf.find(MAGIC, pos + 1)
        while nxt != -1 and decode_at(buf, nxt)[0] is None:
            nxt = buf.find(MAGIC, nxt + 1)
        stop = len(buf) if nxt == -1 else nxt
        out.dropped_bytes += stop - pos
        out.damaged = True
        pos = stop
    return out


def segment_names(dfd: int) -> list[str]:
    """The ring's segments, oldest first (other names in the directory are left alone)."""
    return sorted(n for n in os.listdir(dfd) if SEGMENT_RE.fullmatch(n))


def segment_size(cap: int) -> int:
    return max(cap // SEGMENTS, 4096)


class Recorder:
    """The one writer of a ring: `with Recorder(dir, cap) as r: r.append(record)`."""

    def __init__(self, path: Path, cap: int = DEFAULT_CAP):
        if cap < MIN_CAP:
            raise ProxytuneError(f"the recorder's cap must be at least {MIN_CAP >> 10} KiB, not {cap} bytes")
        self.path, self.cap, self.seg_max = Path(path), cap, segment_size(cap)
        self.dfd = self.lock_fd = self.seg_fd = None
        self.sizes: dict[str, int] = {}
        self.current: str | None = None
        self.dropped = 0                  # records a failed write lost (full disk, I/O error)
        self.last_error: str | None = None

    def __enter__(self):
        self.dfd = files.open_private_dir(self.path)
        try:
            self.lock_fd = _take_lock(self.dfd, self.path)
            for name in segment_names(self.dfd):
                st = os.stat(name, dir_fd=self.dfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise ProxytuneError(f"refusing the recorder {self.path}: its segment {name} is not a plain "
                                         "file of ours", f"remove {self.path / name}; nothing was written")
                self.sizes[name] = st.st_size
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        for fd in (self.seg_fd, self.lock_fd, self.dfd):
            if fd is not None:
                os.close(fd)
        self.seg_fd = self.lock_fd = self.dfd = None

    def append(self, record: dict) -> bool:
        """Store one record; False (and last_error says why) when the disk refused it. The watcher
        goes on either way: a full state filesystem costs windows, never the watch."""
        data = encode(record)
        try:
            if self.current is None or self.sizes[self.current] + len(data) > self.seg_max:
                self._rotate()
            self._trim(len(data))
            files.append(self.seg_fd, data)
        except OSError as e:
            return self._lost(f"cannot write to the recorder {self.path}: {e.strerror or e}")
        except ProxytuneError as e:          # a new segment refused: a full disk, or a name planted there
            return self._lost(e.message)
        self.sizes[self.current] += len(data)
        self.last_error = None
        return True

    def _lost(self, why: str) -> bool:
        self.dropped += 1
        self.last_error = why
        return False

    def total(self) -> int:
        return sum(self.sizes.values())

    def _rotate(self) -> None:
        """Start the next segment (a new run always does: never append after another's tail)."""
        last = int((self.current or max(self.sizes, default="0" * 12))[:12])
        name = f"{last + 1:012d}.seg"
        fd = files.open_append(self.dfd, name, self.path)
        if self.seg_fd is not None:
            os.close(self.seg_fd)
        self.seg_fd, self.current = fd, name
        self.sizes[name] = os.fstat(fd).st_size

    def _trim(self, incoming: int) -> None:
        """Remove the oldest segments until the ring plus `incoming` bytes fits the cap."""
        while self.total() + incoming > self.cap:
            old = next((n for n in sorted(self.sizes) if n != self.current), None)
            if old is None:
                return              # one record bigger than the cap: kept alone in its segment
            files.unlink_in(self.dfd, old, self.path)
            del self.sizes[old]


def _take_lock(dfd: int, path: Path) -> int:
    """flock the ring's lock file, or refuse naming the watcher that holds it."""
    fd = files.open_append(dfd, LOCK, path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(dfd)
        os.close(fd)
        raise ProxytuneError(f"another watcher{holder} is recording into {path}",
                             "stop it first, or give this one its own --state-dir") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass                    # a full disk: the lock holds all the same, only the note is missing
    return fd


def _holder(dfd: int) -> str:
    try:
        fd = files.open_read(dfd, LOCK, Path("."))
    except ProxytuneError:
        return ""
    if fd is None:
        return ""
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(32).decode(errors="replace").strip()
    return f" (pid {text})" if is_uint(text) else ""


SINCE_SLACK_S = 60.0


@dataclass
class Reading:
    """Every intact record of a ring, oldest first, and what had to be dropped to get them."""
    records: list[dict]
    damaged_segments: list[str]
    dropped_bytes: int


def read(path: Path, whole: bool = True, since: float | None = None) -> Reading:
    """Read a ring (no lock needed: a watcher may be writing; its unfinished record is dropped).
    Without `whole`, each record is its head and `_at` ([segment, offset]) for load(). With `since`
    (Unix time), a segment last written before it is not read: each record is appended after its
    window ends, so none of its windows ends later (`watch status` over 15 minutes of a full ring
    read the whole 256 MiB). SINCE_SLACK_S allows for the file system's clock granularity."""
    path = Path(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return Reading([], [], 0)
    dfd = files.open_private_dir(path)
    out = Reading([], [], 0)
    try:
        for name in segment_names(dfd):
            try:
                fd = files.open_read(dfd, name, path)
            except ProxytuneError:          # a symlink or a file not ours: never read
                out.damaged_segments.append(name)
                continue
            if fd is None:
                continue            # removed by the writer's trim while we listed
            if since is not None and os.fstat(fd).st_mtime < since - SINCE_SLACK_S:
                os.close(fd)
                continue
            with os.fdopen(fd, "rb") as fh:
                found = scan(fh.read(), whole)
            for r in found.records if not whole else ():
                r["_at"] = [name, r["_at"]]
            out.records += found.records
            out.dropped_bytes += found.dropped_bytes
            if found.damaged:
                out.damaged_segments.append(name)
    finally:
        os.close(dfd)
    return out


def load(path: Path, at: list) -> dict | None:
    """The whole record a head-only read() placed at `at` ([segment, offset]); None when it is gone
    (the ring moved on) or no longer intact there."""
    name, offset = at
    dfd = files.open_private_dir(Path(path))
    try:
        fd = files.open_read(dfd, name, Path(path)) if SEGMENT_RE.fullmatch(str(name)) else None
    finally:
        os.close(dfd)
    if fd is None or not isinstance(offset, int) or offset < 0:
        return None
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        buf = fh.read(HEADER.size)
        if len(buf) < HEADER.size or HEADER.unpack(buf)[1] > MAX_RECORD:
            return None
        buf += fh.read(HEADER.unpack(buf)[1])
    return decode_at(buf, 0)[0]

