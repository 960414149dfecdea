"""The first collective of every exchange over Unix sockets, when the whole job is on one machine.

Why: every twinkle call under torchrun starts with an all-gather of one small fixed-size slot
per process (`exchange.py`). On gloo that gather costs 430-650 us between two processes on one
machine however small the slot (gloo hands it to its own threads and makes a TCP round trip on
loopback), and starting it asynchronously costs the caller about 190 us more. The same gather
as direct messages on Unix sockets takes about 40 us. So when every process of the job runs on
this machine (`torchrun --nproc_per_node=N` on one node, the common case), the slots go over a
mesh of Unix sockets made at start-up; a job across nodes, or one whose sockets cannot be made,
keeps gloo. Everything after the first collective (second steps, broadcasts of held results,
the user's own collectives) stays on torch.distributed.

Messages: each process sends its slot to every other process, with up to `EAGER_BYTES` of extra
bytes after it (the exchange's payload when it does not fit the slot, which then needs no second
collective). A message is the extra bytes' length, the slot, and the extra bytes; a connection
keeps their order, so the n-th message from a peer is its part of the n-th gather. A peer that
exits closes its connections: a gather still missing its slot fails at once. A peer that hangs
is waited for at most the control group's timeout, as on gloo.

Connections: each process listens on a socket in a private folder of its own (mode 0700, so
only the job's user can connect), the paths and a random tag per process are exchanged over
gloo, each process connects to the lower ranks and accepts the higher ones (a connection
starts with the connecting rank and the listener's tag), and the folders are removed (the
connections stay). Every process then says over gloo whether its part worked; unless every
one did, all of them keep gloo.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
import weakref
from typing import Any, Protocol

log = logging.getLogger("twinkle")

#: What a connecting process sends first: its rank and the listener's tag.
HELLO = struct.Struct("<I16s")
#: What precedes each slot on a connection: the length of the bytes that follow the slot.
PREFIX = struct.Struct("<I")
#: The most a process sends after its slot (`start_gather(extra=...)`). A connection's buffers
#: hold a few such messages, and a process has at most two gathers in flight (the backend
#: finishes the previous calls' exchanges before a call runs), so such a send never waits
#: for a process that has not reached the call yet.
EAGER_BYTES = 64 * 1024
#: Longest wait for the other processes' connections at start-up (they connect right after
#: the paths were exchanged; only a process that cannot reach this machine's sockets is late).
SETUP_TIMEOUT_S = 30.0
#: Longest single sleep of a waiting thread between looks (another thread may have read the
#: slot it waits for).
_NAP_S = 0.05


class Peers(Protocol):
    """What connecting the mesh needs of the processes (the `channel.ControlChannel` over gloo,
    which then gathers its slots over this mesh)."""

    world_size: int
    rank: int

    def all_gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order (on every process)."""


class SocketGather:
    """One gather in flight: `wait(timeout)` and `is_completed()`, as a torch work object."""

    __slots__ = ("_mesh", "buffer", "done", "error", "extras", "index")

    def __init__(self, mesh: SocketMesh, index: int, buffer: bytearray) -> None:
        self._mesh = mesh
        self.index = index
        self.buffer = buffer
        self.done = False
        self.error: str | None = None
        #: What the other processes sent after their slot (`start_gather(extra=...)`), by rank.
        self.extras: dict[int, bytes] = {}

    def is_completed(self) -> bool:
        """True once every slot arrived, or the gather failed (`wait` then raises)."""
        if self.done or self.error is not None:
            return True
        return self._mesh.try_complete(self)

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Wait for every slot, at most `timeout` (None: the control group's timeout)."""
        mesh = self._mesh
        if timeout is None:
            seconds = mesh.timeout_s
        elif isinstance(timeout, datetime.timedelta):
            seconds = timeout.total_seconds()
        else:
            seconds = float(timeout)
        deadline = time.monotonic() + seconds
        while not self.is_completed():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = ", ".join(map(str, mesh.missing(self)))
                raise RuntimeError(
                    f"timed out after {seconds:g}s waiting for process(es) {missing} to reach "
                    "the same call"
                )
            mesh.nap(self, min(left, _NAP_S))
        if self.error is not None:
            raise RuntimeError(self.error)
        return True


class SocketMesh:
    """Connections to every other process of a one-machine job, for the slot gathers."""

    #: The most `start_gather` sends after a slot (the channel's `eager_bytes`).
    eager_bytes = EAGER_BYTES

    def __init__(
        self, rank: int, world_size: int, peers: dict[int, socket.socket], timeout_s: float
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._peers = peers
        for sock in peers.values():
            sock.setblocking(False)
        #: Guards the buffers and each read or write of a socket (never held while sleeping).
        self._lock = threading.Lock()
        #: Held while one gather's messages are sent, so messages never interleave (taken
        #: before `_lock`, never after it).
        self._send_lock = threading.Lock()
        self._size: int | None = None
        self._started = 0
        self._partial = {r: bytearray() for r in peers}
        #: Complete messages from each peer, by their position: (slot, extra bytes).
        self._got: dict[int, dict[int, tuple[bytes, bytes]]] = {r: {} for r in peers}
        self._count = dict.fromkeys(peers, 0)
        #: Peers whose connection ended, and how.
        self._ended: dict[int, str] = {}
        #: Peers that no longer take messages (their end closed; reading goes on to the end).
        self._unsendable: set[int] = set()
        _forget_in_forked_children(self)

    # ----------------------------------------------------------------- set-up
    @classmethod
    def connect(cls, channel: Peers, timeout_s: float) -> SocketMesh | None:
        """Connect every process of `channel` to every other (collective: every process calls
        it at the same point); None on every process unless every process succeeded."""
        world, rank = channel.world_size, channel.rank
        token = secrets.token_bytes(16)
        folder, listener, path = None, None, None
        peers: dict[int, socket.socket] = {}
        why = ""
        try:
            folder = tempfile.mkdtemp(prefix="twinkle-ctl-")  # 0700: this user only
            path = os.path.join(folder, "s")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(world)
        except OSError as exc:
            why, path = f"cannot listen: {exc}", None
        try:
            table = channel.all_gather((path, token))
            if path is not None and all(p is not None for p, _ in table):
                why = _link(rank, world, table, token, listener, peers)
            elif not why:
                why = "another process cannot listen"
        finally:
            if listener is not None:
                listener.close()
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        agreed = channel.all_gather(not why)
        if all(agreed):
            return cls(rank, world, peers, timeout_s)
        for sock in peers.values():
            sock.close()
        log.debug("twinkle: control exchanges stay on gloo (%s)", why or "another process failed")
        return None

    # ----------------------------------------------------------------- gathers
    def start_gather(self, slot: bytearray, extra: bytes = b"") -> tuple[bytearray, SocketGather]:
        """Send `slot` (and up to `EAGER_BYTES` of `extra` after it) to every other process;
        (a buffer that will hold every slot in rank order, the gather, whose `extras` will
        hold the others' extra bytes). Never waits for another process to reach the call."""
        size = len(slot)
        if len(extra) > EAGER_BYTES:
            raise ValueError(f"{len(extra)} extra bytes: at most {EAGER_BYTES} follow a slot")
        gathered = bytearray(size * self.world_size)
        gathered[self.rank * size : (self.rank + 1) * size] = slot
        message = PREFIX.pack(len(extra)) + bytes(slot) + extra
        with self._send_lock:  # one message at a time on each connection
            with self._lock:
                if self._size is None:
                    self._size = size
                    self._split_all()
                elif size != self._size:
                    raise ValueError(
                        f"slots of {size} bytes after {self._size}: sizes must not change"
                    )
                work = SocketGather(self, self._started, gathered)
                self._started += 1
                peers = [
                    (peer, sock)
                    for peer, sock in self._peers.items()
                    if peer not in self._ended and peer not in self._unsendable
                ]
            for peer, sock in peers:
                self._send(peer, sock, message)
        return gathered, work

    def try_complete(self, work: SocketGather) -> bool:
        """Complete `work` if every slot arrived (or fail it if a missing one cannot)."""
        with self._lock:
            if work.done or work.error is not None:
                return True
            self._pump()
            missing = [r for r, got in self._got.items() if work.index not in got]
            if not missing:
                size = self._size or 0
                for peer, got in self._got.items():
                    slot, extra = got.pop(work.index)
                    work.buffer[peer * size : (peer + 1) * size] = slot
                    if extra:
                        work.extras[peer] = extra
                work.done = True
                return True
            gone = [r for r in missing if r in self._ended]
            if gone:
                work.error = "; ".join(
                    f"process {r} {self._ended[r]} before it reached the same call" for r in gone
                )
                return True
            return False

    def missing(self, work: SocketGather) -> list[int]:
        """The processes whose slot of `work` has not arrived."""
        with self._lock:
            return [r for r, got in self._got.items() if work.index not in got]

    def nap(self, work: SocketGather, seconds: float) -> None:
        """Sleep until a missing slot's connection has data, at most `seconds`."""
        with self._lock:
            socks = [
                s
                for r, s in self._peers.items()
                if work.index not in self._got[r] and r not in self._ended
            ]
        if socks:
            _poll(socks, select.POLLIN, seconds)

    def close(self) -> None:
        with self._lock:
            for peer, sock in self._peers.items():
                self._ended.setdefault(peer, "is no longer connected (twinkle shut down here)")
                sock.close()

    # ----------------------------------------------------------------- internals
    def _send(self, peer: int, sock: socket.socket, message: bytes) -> None:
        """Send one message (`_send_lock` held). Never sleeps holding `_lock`: a watchdog
        asking whether a gather arrived must not wait for a peer that does not read."""
        view = memoryview(message)
        deadline = time.monotonic() + self.timeout_s
        while view:
            with self._lock:
                try:
                    view = view[sock.send(view) :]
                    continue
                except BlockingIOError:  # its buffer is full: read what it sent us, then retry
                    self._pump()
                    if time.monotonic() > deadline:
                        self._ended[peer] = f"did not read for {self.timeout_s:g}s"
                        return
                except InterruptedError:
                    continue
                except OSError:
                    # It closed its end: what it sent before is still to be read, and its end
                    # of file then says it is gone (`_pump`).
                    self._unsendable.add(peer)
                    return
            _poll([sock], select.POLLOUT, _NAP_S)

    # ----------------------------------------------------------------- internals (lock held)

    def _pump(self) -> None:
        """Read whatever the peers sent (never waits)."""
        for peer, sock in self._peers.items():
            if peer in self._ended:
                continue
            while True:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                except OSError as exc:
                    self._ended[peer] = f"closed its connection ({type(exc).__name__}: {exc})"
                    break
                if not data:
                    self._ended[peer] = "closed its connection (it exited or shut twinkle down)"
                    break
                self._partial[peer] += data
            self._split(peer)

    def _split_all(self) -> None:
        for peer in self._peers:
            self._split(peer)

    def _split(self, peer: int) -> None:
        """Cut the complete messages (prefix, slot, extra bytes) off the peer's stream."""
        size = self._size
        if size is None:  # a peer's first slot came before ours was sent: sized later
            return
        buf = self._partial[peer]
        got, count, start = self._got[peer], self._count[peer], 0
        head = PREFIX.size + size
        while len(buf) - start >= head:
            (n,) = PREFIX.unpack_from(buf, start)
            end = start + head + n
            if len(buf) < end:
                break
            got[count] = (
                bytes(buf[start + PREFIX.size : start + head]),
                bytes(buf[start + head : end]),
            )
            count += 1
            start = end
        if start:
            del buf[:start]
            self._count[peer] = count


def _link(
    rank: int,
    world: int,
    table: list[tuple[str, bytes]],
    token: bytes,
    listener: Any,
    peers: dict[int, socket.socket],
) -> str:
    """Connect to the lower ranks and accept the higher ones; "" when done, else why not."""
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    try:
        for peer in range(rank):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peers[peer] = sock
            sock.settimeout(SETUP_TIMEOUT_S)
            sock.connect(table[peer][0])
            sock.sendall(HELLO.pack(rank, table[peer][1]))
        for _ in range(rank + 1, world):
            listener.settimeout(max(deadline - time.monotonic(), 0.001))
            conn, _ = listener.accept()
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            hello = _recv_exactly(conn, HELLO.size)
            peer, tag = HELLO.unpack(hello)
            if tag != token or not rank < peer < world or peer in peers:
                conn.close()
                return "an unexpected connection to the control socket"
            peers[peer] = conn
    except OSError as exc:
        return f"cannot connect: {type(exc).__name__}: {exc}"
    return ""


def _poll(socks: list[socket.socket], events: int, seconds: float) -> None:
    """Sleep until one of `socks` is ready for `events`, at most `seconds`. `poll`, not
    `select`: a training process may hold more than 1024 files, and `select` refuses those."""
    poller = select.poll()
    try:
        for sock in socks:
            poller.register(sock, events)
        poller.poll(max(seconds, 0.0) * 1000)
    except (OSError, ValueError):  # closed meanwhile (shutdown): the next look says so
        time.sleep(min(seconds, _NAP_S))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed during the hand-shake")
        data += chunk
    return data


_MESHES: weakref.WeakSet[SocketMesh] = weakref.WeakSet()
_AT_FORK = [False]


def _close_in_child() -> None:
    """A forked child (a DataLoader worker) must not keep the parent's connections open: the
    other processes would not see them close when the parent exits."""
    for mesh in list(_MESHES):
        for sock in mesh._peers.values():
            try:
                sock.close()
            except OSError:
                pass
        mesh._ended = dict.fromkeys(mesh._peers, "is not reachable from a forked child")


def _forget_in_forked_children(mesh: SocketMesh) -> None:
    if not _AT_FORK[0]:
        _AT_FORK[0] = True
        os.register_at_fork(after_in_child=_close_in_child)
    _MESHES.add(mesh)
