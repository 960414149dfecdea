"""One call's exchange between the processes of a torchrun job: one collective when all is well.

Every exchange (a remote call, or the construction of a remote object) starts with the same
collective: an all-gather of one fixed-size *slot* per process, so every process holds every
slot. Measured with gloo between two processes on one machine: a gather of 16-512 bytes takes
430-540 us, about 1.5x an all-reduce of one or two numbers (about 300 us), and an all-reduce of
three or more float64s already takes two steps (500-570 us); one all-reduce cannot carry a
call's identity as well as its value, so the gather is the one collective. A slot is a 32-byte
header and a small inline payload:

    kind u8 | flags u8 | workers u16 | length u32 | seq u64 | key u64 | spec u64 | payload

- `seq`, `kind` and `key` (a hash of the method, the driver's call site and the number of
  workers) identify the call: every process compares every slot with its own, so processes at
  different calls (a call inside `if rank == 0:`, an extra call, another call site) all see the
  difference at once and raise the same error naming each process's call and call site.
- `flags` say whether the process's worker failed (FAILED), whether its payload did not fit
  in the slot (BIG), whether a result for `sum`/`mean` is not a number (OBJECT), and whether
  the payload is the envelope of a result held for a transport (HELD, `transports.py`).
- The payload is the pickled outcome (`collect='none'` & co), or for `sum`/`mean` the result's
  numbers (int64 and float64), with `spec` the fingerprint of its structure (types, dtypes,
  shapes, keys). The numbers are summed locally, in rank order, by every process.

Since every process reads the same slots, every process takes the same decision: in the common
case the call is complete after this one collective. Over the Unix sockets of a one-machine job
(`node_sockets.py`) a gathered result too big for its slot, up to 64 KiB, travels in the slot's
own message, so it needs no second step either (`_follows_slot`). Otherwise a second step
follows, the same on every process: the payloads that did not fit (an all-gather of bytes, or an
all-reduce of the numbers), the failures, the descriptions of diverging calls, or the objects of
results that cannot be summed (the first call of each method also sends the structure of its
result once, so every process can rebuild the value; later calls with the same structure are one
collective).

A result held for a transport (large tensors, a method whose `transport=` resolves to one that
serves this mode: `transports.py`) is not pickled: its slot carries a small envelope, and the
second step broadcasts its tensors as raw bytes from the holder, over twinkle's own groups. Only
the results the collector uses take part (with `collect='first'` the other processes send
nothing). A failure or a divergence is seen in the slots first, so then nothing is broadcast.

The first collective is started when the call is made and runs in gloo's thread; the call
waits for it when collected (with the LazyCollect's or the method's timeout). Exchanges are
finished strictly in the order they were started (`exchange_queue.py`), so the second
steps of all processes line up too.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from twinkle_core import DeviceMesh, TwinkleError
from twinkle_core.plugin import PendingCall

from . import numeric
from .calls import LocalPendingCall, decode, encode
from .channel import ChannelError
from .skeleton import fill
from .transports import Envelope, Held, broadcast_bytes, broadcast_held

if TYPE_CHECKING:
    from .session import Session

KIND_GATHER, KIND_REDUCE, KIND_CONSTRUCT = 1, 2, 3
KIND_NAMES = {KIND_GATHER: "gathered", KIND_REDUCE: "all-reduced", KIND_CONSTRUCT: "construct"}
F_FAILED, F_BIG, F_OBJECT, F_HELD = 1, 2, 4, 8

HEADER = struct.Struct("<BBHIQQQ")  # kind, flags, ncalls, length, seq, key, spec
HEADER_BYTES = HEADER.size
KIND, FLAGS, NCALLS, LENGTH, SEQ, KEY, SPEC = range(7)
_FLOAT = struct.Struct("<d")
_INT = struct.Struct("<q")
_FLOAT_SPEC = numeric.numeric_spec(0.5)


def slot_bytes(world_size: int) -> int:
    """Bytes of one process's slot: smaller slots for larger worlds (the buffer is world x
    slot), always room for the header and a few numbers."""
    if world_size <= 32:
        return 256
    if world_size <= 256:
        return 128
    return 64


_KEYS: dict[tuple, int] = {}


def call_key(kind: int, label: str, site: str, ncalls: int) -> int:
    """A 63-bit hash of what identifies a call, the same in every process (never 0)."""
    parts = (kind, label, site, ncalls)
    key = _KEYS.get(parts)
    if key is None:
        text = "\x00".join(str(p) for p in parts).encode()
        key = (int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1) or 1
        if len(_KEYS) < 65536:
            _KEYS[parts] = key
    return key


class CallInfo:
    """What identifies one exchange, for the checks between processes and for messages."""

    __slots__ = ("arguments", "key", "kind", "label", "ncalls", "seq", "site", "thread")

    def __init__(
        self,
        seq: int,
        kind: int,
        label: str,
        site: str,
        ncalls: int,
        thread: str,
        arguments: int = 0,
    ) -> None:
        self.seq = seq
        self.kind = kind
        self.label = label
        self.site = site
        self.ncalls = ncalls
        self.thread = thread
        #: The fingerprint of the call's arguments (`fingerprint.arguments_print`; 0: none).
        self.arguments = arguments
        key = call_key(kind, label, site, ncalls)
        self.key = ((key ^ arguments) & (2**63 - 1)) or 1 if arguments else key

    def describe(self) -> str:
        if self.kind == KIND_CONSTRUCT:
            what = f"constructing {self.label}"
        else:
            what = f"{self.label} on {self.ncalls} worker(s), {KIND_NAMES.get(self.kind, '?')}"
        given = f", arguments {self.arguments:016x}" if self.arguments else ""
        return f"call #{self.seq} {what} from {self.site}{given} (thread {self.thread!r})"


#: This process's outcome of a call: (index of its call, ok, value or WorkerFailure), or None.
Mine = tuple[int, bool, Any] | None


class ExchangeDriver(Protocol):
    """What an exchange needs from whoever starts and finishes the exchanges in order (the
    run's `exchange_queue.ExchangeQueue`)."""

    #: This process in the run: its channel, node names and `isolate`.
    session: Session
    #: Structures of sum/mean results every process knows, by `numeric.spec_key`.
    spec_cache: dict[int, Any]

    def transport_group(self, torch_backend: str) -> Any:
        """The group a held result of `torch_backend` is broadcast over."""

    def lost_outcome(
        self, info: CallInfo, ranks: list[int], exc: BaseException
    ) -> LocalPendingCall:
        """The outcome of an exchange whose collective broke (the run is broken)."""

    def wait_for(self, exchange: Exchange, timeout: float | None) -> None:
        """Wait (bounded by `timeout`) until `exchange` is finished, in order."""

    def try_finish(self, exchange: Exchange) -> bool:
        """Finish `exchange` if that needs no waiting; whether it is finished."""


class Exchange:
    """The exchange of one call; `finish()` must be called in the order exchanges started."""

    def __init__(
        self,
        driver: ExchangeDriver,
        info: CallInfo,
        ranks: list[int],
        mine: Mine,
        *,
        reps: frozenset[int] = frozenset(),
        op: str | None = None,
        mesh: DeviceMesh | None = None,
        held: Held | None = None,
        skip: bool = False,
        partial: bool = False,
    ) -> None:
        self.driver = driver
        self.session = driver.session
        self.info = info
        self.ranks = ranks  # process of each call, in call order
        self.mine = mine
        self.reps = reps
        self.op = op
        self.mesh = mesh
        #: This process's result as held for a transport (its slot carries the envelope).
        self.held = held
        #: Whether this process's result is one the collector does not use (not sent).
        self.skip = skip
        #: Whether only the results the collector uses are exchanged (some are not sent).
        self.partial = partial
        self.work: Any = None
        self.buffer: Any = None  # every process's slot, once gathered (a bytearray)
        #: The other processes' payloads that followed their slot, by rank (`_payloads`).
        self._extras: dict[int, bytes] = {}
        self.data: Any = None  # the same as bytes
        self.payload = b""
        self.outcome: LocalPendingCall | None = None
        self._spec: Any = None
        self._finish_lock = threading.Lock()
        #: Whether a wait for the other processes already gave up on this exchange.
        self.timed_out = False

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Write this process's slot and start the first collective (never blocks on peers)."""
        session = self.session
        channel = session.channel
        info = self.info
        flags, spec_key = 0, 0
        mine = self.mine
        if mine is not None:
            index, ok, value = mine
            rank = self.ranks[index]
            if not ok:
                flags |= F_FAILED
                self.payload, _ = encode(False, value, rank, session.node, info.label)
            elif self.held is not None:
                flags |= F_HELD
                self.payload = self.held.envelope
            elif self.skip:
                pass
            elif info.kind == KIND_REDUCE:
                if index in self.reps:
                    spec = _FLOAT_SPEC if type(value) is float else numeric.numeric_spec(value)
                    if spec is None:
                        self.payload, ok = encode(True, value, rank, session.node, info.label)
                        flags |= F_OBJECT
                        if not ok:
                            payload = self.payload
                            self.mine = (index, False, decode(payload, rank, None, info.label)[1])
                    else:
                        self._spec = spec
                        spec_key = numeric.spec_key(spec)
                        if spec.kind == "float" and isinstance(spec, numeric.Leaf):
                            self.payload = _FLOAT.pack(value)
                        else:
                            ints, floats = numeric.flat_numbers(value, spec)
                            self.payload = ints.tobytes() + floats.tobytes()
            else:
                self.payload, ok = encode(True, value, rank, session.node, info.label)
                if not ok:  # the result cannot be sent: this worker's failure, here too
                    flags |= F_FAILED
                    self.mine = (index, False, decode(self.payload, rank, None, info.label)[1])
        slot = slot_bytes(channel.world_size)
        length = len(self.payload)
        if length > slot - HEADER_BYTES:
            flags |= F_BIG
        mine = bytearray(slot)
        HEADER.pack_into(
            mine, 0, info.kind, flags, info.ncalls, length, info.seq, info.key, spec_key
        )
        if length and not flags & F_BIG:
            mine[HEADER_BYTES : HEADER_BYTES + length] = self.payload
        self._slot = mine  # alive until the collective has read it
        # A payload too big for the slot follows it in the same message where it can
        # (`eager_bytes`: over the Unix sockets of a one-machine job), else in a second step.
        follows = _follows_slot(info.kind, flags, length, channel.eager_bytes)
        extra = self.payload if follows else b""
        try:
            self.buffer, self.work = channel.start_gather(mine, extra)
        except ChannelError as exc:
            self._lost(exc)

    # ----------------------------------------------------------------- state
    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def arrived(self) -> bool:
        """Whether the first collective is over (every process has reached this call)."""
        return self.outcome is not None or self.work.is_completed()

    def needs_second_step(self) -> bool:
        """After `arrived()`: whether finishing needs another collective (never blocks)."""
        if self.outcome is not None:
            return False
        heads = self._headers()
        if not _same_call(heads, heads[self.session.channel.rank]):
            return True
        capacity = slot_bytes(self.session.channel.world_size) - HEADER_BYTES
        eager = self.session.channel.eager_bytes
        if any(h[FLAGS] & F_FAILED for h in heads):
            return any(h[FLAGS] & F_FAILED and h[LENGTH] > capacity for h in heads)
        if any(h[FLAGS] & F_HELD for h in heads):
            return True
        if self.info.kind == KIND_REDUCE:
            fast, contributors, _ = self._fast_reduce(heads)
            return not fast or any(heads[r][LENGTH] > capacity for r in contributors)
        return any(
            h[LENGTH] > capacity and not _follows_slot(h[KIND], h[FLAGS], h[LENGTH], eager)
            for h in heads
        )

    # ----------------------------------------------------------------- finish
    def finish(self) -> LocalPendingCall:
        """Complete the exchange (second step if needed) once the first collective is over.

        Called by the driver in start order, with its lock held.
        """
        with self._finish_lock:
            if self.outcome is not None:
                return self.outcome
            try:
                self.work.wait()
            except Exception as exc:
                return self._lost(ChannelError(f"{type(exc).__name__}: {exc}"))
            self._extras = getattr(self.work, "extras", None) or {}
            try:
                self.outcome = self._decide()
            except ChannelError as exc:
                return self._lost(exc)
            self.buffer = self.data = self.work = self._slot = None
            self._heads = None
            self._extras = {}
            return self.outcome

    def _lost(self, exc: BaseException) -> LocalPendingCall:
        self.outcome = self.driver.lost_outcome(self.info, self.ranks, exc)
        self.buffer = self.data = None
        return self.outcome

    def _headers(self) -> list[tuple]:
        """Every process's header (kind, flags, ncalls, length, seq, key, spec), by rank."""
        heads = getattr(self, "_heads", None)
        if heads is None:
            if self.data is None:
                self.data = memoryview(self.buffer)
            slot = slot_bytes(self.session.channel.world_size)
            data = self.data
            heads = [
                HEADER.unpack_from(data, r * slot) for r in range(self.session.channel.world_size)
            ]
            self._heads = heads
        return heads

    def _inline(self, rank: int, length: int) -> bytes:
        start = rank * slot_bytes(self.session.channel.world_size) + HEADER_BYTES
        return self.data[start : start + length].tobytes()

    def _decide(self) -> LocalPendingCall:
        heads = self._headers()
        mine = heads[self.session.channel.rank]
        kind, ncalls, seq, key = mine[KIND], mine[NCALLS], mine[SEQ], mine[KEY]
        flags = 0
        for h in heads:  # one pass: the same call everywhere? any flag?
            if h[KEY] != key or h[SEQ] != seq or h[KIND] != kind or h[NCALLS] != ncalls:
                return self._diverged()
            flags |= h[FLAGS]
        if flags & F_FAILED:
            return self._failures(heads)
        if flags & F_HELD:
            return self._held(heads)
        if kind == KIND_REDUCE:
            return self._reduced(heads)
        return self._gathered(heads)

    # ----------------------------------------------------------------- payloads
    def _payloads(self, heads: list[tuple], ranks: list[int]) -> dict[int, bytes]:
        """The payloads of `ranks`: from the slots, from what followed the slots (within
        `eager_bytes`), and an all-gather for those too big for either."""
        channel = self.session.channel
        capacity = slot_bytes(channel.world_size) - HEADER_BYTES
        eager = channel.eager_bytes
        me = channel.rank
        out: dict[int, bytes] = {}
        big = []
        for r in ranks:
            if heads[r][LENGTH] <= capacity:
                out[r] = self._inline(r, heads[r][LENGTH])
            elif _follows_slot(heads[r][KIND], heads[r][FLAGS], heads[r][LENGTH], eager):
                out[r] = self.payload if r == me else self._extras[r]
            else:
                big.append(r)
        if big:
            size = max(heads[r][LENGTH] for r in big)
            got = channel.all_gather_bytes(self.payload if me in big else b"", size)
            for r in big:
                out[r] = got[r][: heads[r][LENGTH]]
        return out

    def _index_of(self, rank: int) -> int | None:
        try:
            return self.ranks.index(rank)
        except ValueError:
            return None

    def _decode(self, rank: int, blob: bytes) -> tuple[bool, Any]:
        session = self.session
        index = self._index_of(rank)
        worker_rank = self.ranks[index] if index is not None else rank
        mine = self.mine
        if (
            rank == session.channel.rank
            and mine is not None
            and (not mine[1] or not session.isolate)
        ):
            # This process's own failure keeps its traceback; its result skips the copy.
            return mine[1], mine[2]
        note = self.info.kind != KIND_CONSTRUCT  # construction failures get their own note
        return decode(blob, worker_rank, session.node_of(worker_rank), self.info.label, note)

    def _failures(self, heads: list[tuple]) -> LocalPendingCall:
        failed = [r for r, h in enumerate(heads) if h[FLAGS] & F_FAILED]
        payloads = self._payloads(heads, failed)
        failures = []
        for rank in failed:
            ok, value = self._decode(rank, payloads[rank])
            if not ok:
                failures.append(value)
        failures.sort(key=lambda f: f.rank)
        return LocalPendingCall(None, failures, label=self.info.label)

    def _gathered(self, heads: list[tuple]) -> LocalPendingCall:
        senders = [r for r, h in enumerate(heads) if h[LENGTH]]
        payloads = self._payloads(heads, senders)
        results: list[Any] = [None] * len(self.ranks)
        failures = []
        for rank in senders:
            index = self._index_of(rank)
            ok, value = self._decode(rank, payloads[rank])
            if not ok:
                failures.append(value)
            elif index is not None:
                results[index] = value
        if self.partial:
            return LocalPendingCall(
                results, failures, mesh=self.mesh, label=self.info.label, partial=True
            )
        return LocalPendingCall(results, failures, label=self.info.label)

    # ----------------------------------------------------------------- held results
    def _held(self, heads: list[tuple]) -> LocalPendingCall:
        """Some used results are held for a transport: the others' payloads as usual (for
        `sum`/`mean`, their objects), then each held one broadcast from its holder, in rank
        order. Every process takes these steps alike (they follow from the slots)."""
        session = self.session
        channel = session.channel
        me = channel.rank
        label = self.info.label
        results: list[Any] = [None] * len(self.ranks)
        failures = []
        plain = [r for r, h in enumerate(heads) if h[LENGTH] and not h[FLAGS] & F_HELD]
        if plain:
            if self.info.kind == KIND_REDUCE:  # their slots hold numbers: send the objects
                entry = None
                mine = self.mine
                if me in plain and mine is not None and mine[1]:
                    entry, _ = encode(True, mine[2], self.ranks[mine[0]], session.node, label)
                gathered = channel.all_gather(entry)
                blobs = {r: gathered[r] for r in plain}
            else:
                blobs = self._payloads(heads, plain)
            for rank in plain:
                ok, value = self._decode(rank, blobs[rank])
                index = self._index_of(rank)
                if not ok:
                    failures.append(value)
                elif index is not None:
                    results[index] = value
        capacity = slot_bytes(channel.world_size) - HEADER_BYTES
        for rank, head in enumerate(heads):
            if not head[FLAGS] & F_HELD:
                continue
            held = self.held if rank == me else None
            length = head[LENGTH]
            try:
                if length <= capacity:
                    blob = self._inline(rank, length)
                else:
                    blob = broadcast_bytes(
                        channel.group, rank, None if held is None else held.envelope, length
                    )
                envelope: Envelope = pickle.loads(blob)
                group = self.driver.transport_group(envelope.backend)
                tensors = broadcast_held(group, rank, held, envelope, session.isolate)
            except ChannelError:
                raise
            except Exception as exc:  # a broken broadcast: a process died or stopped answering
                raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
            index = self._index_of(rank)
            if index is None:
                continue
            if held is not None and not session.isolate and self.mine is not None:
                results[index] = self.mine[2]  # the holder's own objects, as the exchange does
            else:
                results[index] = fill(envelope.skeleton, tensors)
        return LocalPendingCall(
            results, failures, mesh=self.mesh, label=label, partial=True, private=session.isolate
        )

    # ----------------------------------------------------------------- sum / mean
    def _fast_reduce(self, heads: list[tuple]) -> tuple[bool, list[int], Any]:
        """Whether the numbers can be summed as they are: (yes, contributing ranks, spec)."""
        contributors = [r for r, h in enumerate(heads) if h[SPEC]]
        expected = len({self.ranks[i] for i in self.reps})
        if (
            not contributors
            or len(contributors) != expected
            or any(h[FLAGS] & F_OBJECT for h in heads)
        ):
            return False, contributors, None
        first = heads[contributors[0]][SPEC]
        if any(heads[r][SPEC] != first for r in contributors):
            return False, contributors, None
        spec = self.driver.spec_cache.get(first)
        return spec is not None, contributors, spec

    def _reduced(self, heads: list[tuple]) -> LocalPendingCall:
        fast, contributors, spec = self._fast_reduce(heads)
        if not fast:
            return self._reduce_objects(heads)
        count = len(self.reps)
        slot = slot_bytes(self.session.channel.world_size)
        if all(heads[r][LENGTH] <= slot - HEADER_BYTES for r in contributors):
            data = self.data
            if isinstance(spec, numeric.Leaf) and spec.kind in ("int", "float"):
                # One number: summed as a python number, in rank order on every process.
                unpack = _INT.unpack_from if spec.kind == "int" else _FLOAT.unpack_from
                total = unpack(data, contributors[0] * slot + HEADER_BYTES)[0]
                for rank in contributors[1:]:
                    total += unpack(data, rank * slot + HEADER_BYTES)[0]
                value = total / count if self.op == "mean" else total
            else:
                sizes = numeric.buffer_sizes(spec)
                n_int, n_float = sizes[numeric.INT64], sizes[numeric.FLOAT64]
                ints = np.zeros(n_int, np.int64)
                floats = np.zeros(n_float, np.float64)
                for rank in contributors:  # rank order: the same sum in every process
                    start = rank * slot + HEADER_BYTES
                    if n_int:
                        ints += np.frombuffer(data, np.int64, n_int, start)
                    if n_float:
                        floats += np.frombuffer(data, np.float64, n_float, start + 8 * n_int)
                value = numeric.unpack_sums(ints, floats, spec, self.op, count)
        else:  # too big for the slots: an all-reduce of the numbers themselves
            local = [self.mine[2]] if self._spec is not None else []
            buffers = self.session.channel.all_reduce_sum(numeric.pack(local, spec))
            value = numeric.unpack(buffers, spec, self.op, count)
        return LocalPendingCall(
            None, reduced=value, reduce_op=self.op, mesh=self.mesh, label=self.info.label
        )

    def _reduce_objects(self, heads: list[tuple]) -> LocalPendingCall:
        """Results that cannot be summed as they are (not numbers, structures that differ, or
        a structure not yet known everywhere): gather them for the collector, and remember a
        structure every contributor shares so the next call is summed in place."""
        session = self.session
        mine = self.mine
        sending = mine is not None and mine[1] and mine[0] in self.reps
        entry: Any = None
        if sending:
            blob = self.payload
            if self._spec is not None:
                blob, _ = encode(True, mine[2], self.ranks[mine[0]], session.node, self.info.label)
            entry = (_safe_dumps(self._spec), blob)
        gathered = session.channel.all_gather(entry)
        results: list[Any] = [None] * len(self.ranks)
        failures, specs = [], []
        for rank, item in enumerate(gathered):
            if item is None:
                continue
            spec_blob, blob = item
            index = self._index_of(rank)
            ok, value = self._decode(rank, blob)
            if not ok:
                failures.append(value)
            elif index is not None:
                results[index] = value
            specs.append(_safe_loads(spec_blob))
        if specs and all(s is not None and numeric.same_spec(specs[0], s) for s in specs):
            self.driver.spec_cache[numeric.spec_key(specs[0])] = specs[0]
        return LocalPendingCall(
            results,
            failures,
            reduce_op=self.op,
            mesh=self.mesh,
            label=self.info.label,
            partial=True,
        )

    # ----------------------------------------------------------------- divergence
    def _diverged(self) -> LocalPendingCall:
        """Processes at different calls: every process raises the same error naming each
        process's call and call site."""
        described = self.session.channel.all_gather(self.info.describe())
        groups: dict[str, list[int]] = {}
        for rank, text in enumerate(described):
            groups.setdefault(str(text), []).append(rank)
        where = "; ".join(
            f"process{'es' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}"
            for text, ranks in groups.items()
        )
        error = TwinkleError(
            f"mode 'local': the torchrun processes diverged at exchange #{self.info.seq} "
            f"({where}); every process must make the same remote calls in the same order "
            "(do not call remote methods inside `if rank == ...` blocks of the driver script; "
            "calls from several driver threads are paired by their order in each process, so "
            "threads calling one line with different arguments must take turns in a fixed "
            "order, or make those calls from one thread)"
        )
        return LocalPendingCall(None, [], label=self.info.label, error=error)


def _follows_slot(kind: int, flags: int, length: int, eager_bytes: int) -> bool:
    """Whether a payload too big for its slot followed the slot in the same message: a
    gathered result (not a failure, nor a held envelope, nor `sum`/`mean` numbers, whose
    second steps read them otherwise) within `eager_bytes` (0 on gloo). Every process
    decides alike from the header."""
    return bool(
        flags & F_BIG
        and not flags & (F_FAILED | F_HELD)
        and kind != KIND_REDUCE
        and length <= eager_bytes
    )


def _same_call(heads: list[tuple], mine: tuple) -> bool:
    kind, ncalls, seq, key = mine[KIND], mine[NCALLS], mine[SEQ], mine[KEY]
    return all(
        h[KIND] == kind and h[NCALLS] == ncalls and h[SEQ] == seq and h[KEY] == key for h in heads
    )


def _safe_dumps(value: Any) -> bytes | None:
    try:
        return pickle.dumps(value)
    except Exception:
        return None


def _safe_loads(blob: bytes | None) -> Any:
    if blob is None:
        return None
    try:
        return pickle.loads(blob)
    except Exception:
        return None


class ExchangedCall(PendingCall):
    """A call whose exchange was started: complete once every process has reached it.

    `collect`/`wait` wait for the other processes at most `timeout` seconds (the
    LazyCollect's, else the method's); a call that timed out can be collected again later.
    """

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def _outcome(self, timeout: float | None) -> LocalPendingCall:
        exchange = self.exchange
        if exchange.outcome is None:
            exchange.driver.wait_for(exchange, timeout)
        assert exchange.outcome is not None
        return exchange.outcome

    def wait(self, timeout: float | None) -> list[Any]:
        return self._outcome(timeout).wait(timeout)

    def collect(self, collector: Any, device_mesh: DeviceMesh, timeout: float | None) -> Any:
        return self._outcome(timeout).collect(collector, device_mesh, timeout)

    def done(self) -> bool:
        exchange = self.exchange
        return exchange.outcome is not None or exchange.driver.try_finish(exchange)

    def succeeded(self) -> bool:
        outcome = self.exchange.outcome
        return outcome is not None and outcome.succeeded()
