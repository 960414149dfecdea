"""The slot gathers over Unix sockets of a job on one machine (`twinkle_local/node_sockets.py`).

Real sockets between threads (one per rank) that share an in-memory stand-in for the gloo
channel the mesh is set up through. The torchrun jobs of `test_collect_fast.py` (both paths),
`test_reliability.py` and `test_torchrun.py` run the same code between real processes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_local import node_sockets
from twinkle_local.node_sockets import SocketMesh

SLOT = 256


class Board:
    """`all_gather` for threads: every rank's object, in rank order."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list = [None] * world


class ThreadChannel:
    def __init__(self, board: Board, rank: int) -> None:
        self.board = board
        self.rank = rank
        self.world_size = board.world

    def all_gather(self, obj):
        self.board.slots[self.rank] = obj
        self.board.barrier.wait()
        out = list(self.board.slots)
        self.board.barrier.wait()
        return out


def on_every_rank(world: int, fn):
    """fn(rank) on `world` threads at once; their results in rank order (errors re-raised)."""
    results: list = [None] * world
    errors: list = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return results


@contextlib.contextmanager
def connected(world: int) -> Iterator[list[SocketMesh]]:
    """A mesh per rank, set up at once as the ranks of a job do; all closed afterwards."""
    board = Board(world)
    got = on_every_rank(world, lambda r: SocketMesh.connect(ThreadChannel(board, r), 30.0))
    assert all(isinstance(m, SocketMesh) for m in got), got
    try:
        yield got
    finally:
        for mesh in got:
            mesh.close()


def slot_of(rank: int, n: int) -> bytearray:
    slot = bytearray(SLOT)
    slot[:16] = f"r{rank}n{n}".ljust(16).encode()
    return slot


def expected(world: int, n: int) -> bytes:
    return b"".join(bytes(slot_of(r, n)) for r in range(world))


def test_every_rank_gets_every_slot_in_rank_order_even_when_ranks_run_ahead():
    world = 3
    with connected(world) as mesh:
        # Rank 2 starts 5 gathers before anyone else starts one: its slots queue on the
        # connections and are matched to the others' gathers by position.
        ahead = [mesh[2].start_gather(slot_of(2, n)) for n in range(5)]

        def rest(rank: int) -> list[bytes]:
            out = []
            for n in range(5):
                buffer, work = mesh[rank].start_gather(slot_of(rank, n))
                assert work.wait(10)
                out.append(bytes(buffer))
            return out

        got = on_every_rank(2, rest)
        for n, (buffer, work) in enumerate(ahead):
            assert work.wait(10) and work.is_completed()
            assert bytes(buffer) == expected(world, n)
            assert got[0][n] == got[1][n] == expected(world, n)


def test_extra_bytes_after_a_slot_reach_every_other_rank_and_are_bounded():
    with connected(3) as mesh:
        extras = {0: b"", 1: b"x" * 5000, 2: bytes(range(256)) * 256}  # up to EAGER_BYTES

        def gather(rank: int):
            buffer, work = mesh[rank].start_gather(slot_of(rank, 0), extras[rank])
            assert work.wait(10)
            return bytes(buffer), work.extras

        got = on_every_rank(3, gather)
        for rank, (buffer, received) in enumerate(got):
            assert buffer == expected(3, 0)
            assert received == {r: e for r, e in extras.items() if r != rank and e}
        with pytest.raises(ValueError, match="at most 65536"):
            mesh[0].start_gather(slot_of(0, 1), bytes(node_sockets.EAGER_BYTES + 1))


def test_a_peer_that_closes_fails_the_gather_at_once_naming_it():
    with connected(2) as mesh:
        _, work = mesh[0].start_gather(slot_of(0, 0))
        mesh[1].close()  # as a process that exits does
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="process 1 closed its connection"):
            work.wait(30)
        assert time.monotonic() - start < 10  # not the 30 s timeout
        assert work.is_completed()


def test_a_slot_sent_before_the_peer_closed_still_completes_its_gather():
    with connected(2) as mesh:
        mesh[1].start_gather(slot_of(1, 0))
        mesh[1].close()
        buffer, work = mesh[0].start_gather(slot_of(0, 0))
        assert work.wait(10)
        assert bytes(buffer) == expected(2, 0)
        _, later = mesh[0].start_gather(slot_of(0, 1))
        with pytest.raises(RuntimeError, match="process 1"):
            later.wait(10)


def test_a_silent_peer_times_out_naming_it_and_can_still_arrive_later():
    with connected(3) as mesh:
        mesh[1].start_gather(slot_of(1, 0))
        buffer, work = mesh[0].start_gather(slot_of(0, 0))
        with pytest.raises(RuntimeError, match=r"timed out after 0.3s .*process\(es\) 2\b"):
            work.wait(0.3)
        assert not work.is_completed()
        mesh[2].start_gather(slot_of(2, 0))
        assert work.wait(10)
        assert bytes(buffer) == expected(3, 0)


def test_the_mesh_is_used_only_if_every_rank_could_listen(monkeypatch):
    board = Board(2)
    real = socket.socket.bind

    def refuse_on_rank_1(self, address):
        if threading.current_thread().name == "rank-1":
            raise PermissionError("no sockets here")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "bind", refuse_on_rank_1)

    def connect(rank: int):
        threading.current_thread().name = f"rank-{rank}"
        return SocketMesh.connect(ThreadChannel(board, rank), 5)

    assert on_every_rank(2, connect) == [None, None]


def test_a_stranger_on_the_socket_turns_the_mesh_off_everywhere(monkeypatch):
    """A connection without the listener's tag is refused: every rank keeps gloo."""
    board = Board(2)
    real_pack = node_sockets.HELLO.pack

    class WrongTag:
        size = node_sockets.HELLO.size
        unpack = node_sockets.HELLO.unpack

        @staticmethod
        def pack(rank, tag):
            return real_pack(rank, bytes(16))

    monkeypatch.setattr(node_sockets, "HELLO", WrongTag)
    got = on_every_rank(2, lambda r: SocketMesh.connect(ThreadChannel(board, r), 5))
    assert got == [None, None]


def test_the_listening_folder_is_private_and_removed(monkeypatch):
    seen: list[str] = []
    real = socket.socket.bind

    def note(self, address):
        seen.append(address)
        assert os.stat(os.path.dirname(address)).st_mode & 0o077 == 0  # owner only
        return real(self, address)

    monkeypatch.setattr(socket.socket, "bind", note)
    with connected(2):
        pass
    assert len(seen) == 2 and not any(os.path.exists(os.path.dirname(p)) for p in seen)


def test_a_forked_child_does_not_keep_the_connections_open():
    """A DataLoader worker forked from a rank must not hold its sockets: when the rank exits,
    the other ranks must see its connections close, not wait for the child."""
    with connected(2) as mesh:
        pid = os.fork()
        if pid == 0:  # the child: outlives the parent's close by far
            time.sleep(20)
            os._exit(0)
        try:
            _, work = mesh[0].start_gather(slot_of(0, 0))
            mesh[1].close()
            with pytest.raises(RuntimeError, match="process 1 closed"):
                work.wait(10)
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def test_waits_work_with_file_descriptors_above_1024():
    """A training process can hold more than 1024 files; `select` refuses descriptors above
    FD_SETSIZE, so waiting must not use it (it would raise, or spin without sleeping)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, hard), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with connected(2) as mesh:
            assert all(s.fileno() > 1024 for m in mesh for s in m._peers.values())
            buffer, work = mesh[0].start_gather(slot_of(0, 0))
            cpu = time.process_time()
            with pytest.raises(RuntimeError, match="timed out after 1s"):
                work.wait(1.0)  # nobody sends: a wait that sleeps, not one that spins
            assert time.process_time() - cpu < 0.3
            threading.Timer(0.2, lambda: mesh[1].start_gather(slot_of(1, 0))).start()
            assert work.wait(10)
            assert bytes(buffer) == expected(2, 0)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_peer_that_does_not_read_never_blocks_a_look_at_a_gather():
    """While a send waits for a peer that does not read (its buffer full), another thread (the
    watchdog) asking whether a gather arrived gets its answer at once."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mesh = SocketMesh(0, 2, {1: mine}, timeout_s=60)
    big = bytearray(64 * 1024)
    first = mesh.start_gather(big)[1]
    sending = threading.Thread(target=lambda: [mesh.start_gather(big) for _ in range(64)])
    sending.start()
    try:
        for _ in range(20):  # about 1 s of looks while the sender waits
            time.sleep(0.05)
            start = time.monotonic()
            assert first.is_completed() is False
            assert time.monotonic() - start < 1.0
        # 4 MiB cannot all fit the connection's buffers: the sender is still waiting to send.
        assert sending.is_alive()
    finally:
        theirs.close()  # the peer goes: the send stops, the gathers fail
        sending.join(30)
        mesh.close()
    assert not sending.is_alive()
    with pytest.raises(RuntimeError, match="process 1"):
        first.wait(10)


@settings(max_examples=40)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=3 * SLOT), min_size=1, max_size=12),
    extras=st.lists(st.binary(max_size=600), min_size=1, max_size=4),
)
def test_slots_arriving_in_any_pieces_are_put_back_together(cuts, extras):
    """The stream is cut anywhere (the kernel may deliver a message in pieces, or several at
    once): each gather still gets exactly its own slot and extra bytes from the peer."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mesh = SocketMesh(0, 2, {1: mine}, timeout_s=10)
    gathers = len(extras)
    try:
        works = [mesh.start_gather(slot_of(0, n)) for n in range(gathers)]
        stream = b"".join(
            node_sockets.PREFIX.pack(len(extras[n])) + bytes(slot_of(1, n)) + extras[n]
            for n in range(gathers)
        )
        position, pieces = 0, iter(cuts)
        while position < len(stream):
            size = next(pieces, len(stream))
            theirs.sendall(stream[position : position + size])
            position += size
            works[0][1].is_completed()  # reads whatever arrived so far
        for n, (buffer, work) in enumerate(works):
            assert work.wait(10)
            assert bytes(buffer) == expected(2, n)
            assert work.extras == ({1: extras[n]} if extras[n] else {})
    finally:
        mesh.close()
        theirs.close()
