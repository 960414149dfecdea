"""Where is everyone? Python stacks of the driver and every worker, grouped like py-spy dump.

`twinkle_core.dump_stacks()` (and `SIGUSR1` sent to the driver while a run is active) collects
the stack of every thread of the driver process and of every worker, and prints them grouped
by identical stacks: one block per distinct stack with the workers that share it, so 16 ranks
stuck in the same all-reduce read as one block. A call that passes its timeout carries the
same text as a note of its `CallTimeoutError`.

Workers in the driver's process (mode 'inprocess', and each torchrun process's own worker)
are covered by the driver's threads; under torchrun each process dumps its own. Backends whose
workers live elsewhere add a source (`add_source`): e.g. Ray asks each actor's side thread,
which answers even while the actor runs a method.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import traceback
from typing import Any

log = logging.getLogger("twinkle.stacks")

#: Frames of each stack kept (the innermost ones).
MAX_FRAMES = 40
#: A call's timeout of at least this many seconds gets the stacks as a note (shorter ones are
#: polls, e.g. `lazy(timeout=0.1)` in a loop, which should stay cheap).
NOTE_MIN_TIMEOUT_S = 1.0
#: Threads of Ray, Python and twinkle itself that never run user code: left out of dumps.
QUIET_THREADS = ("ray_", "PythonGCThread", "twinkle-")
#: Frames of Ray's own task loop above the user's code: left out of stacks.
HIDDEN_FILES = ("/ray/_private/", "/ray/util/tracing/", "/ray/_raylet")


def format_stack(frame: Any, limit: int = MAX_FRAMES) -> str:
    """A frame's stack, outermost first, as `traceback` prints it (innermost `limit` frames;
    Ray's task loop left out)."""
    entries = [
        e for e in traceback.extract_stack(frame) if not any(h in e.filename for h in HIDDEN_FILES)
    ]
    return "".join(traceback.format_list(entries[-limit:])).rstrip()


def thread_stacks(skip_current: bool = True) -> list[tuple[str, str]]:
    """[(thread description, stack)] of every thread of this process but the quiet ones
    (`QUIET_THREADS`: Ray's, Python's and twinkle's own helpers)."""
    frames = sys._current_frames()
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in frames.items():
        if ident == me:
            if skip_current:
                continue
            while frame.f_back is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back  # where this thread is, not this module's own frames
        thread = names.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        if name.startswith(QUIET_THREADS):
            continue
        if thread is not None and thread.daemon:
            name += " (daemon)"
        out.append((name, format_stack(frame)))
    return out


def group_stacks(entries: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """Identical stacks together: [(who shares it, stack)], the most shared first."""
    by_stack: dict[str, list[str]] = {}
    for who, stack in entries:
        by_stack.setdefault(stack, []).append(who)
    grouped = [(sorted(w, key=_natural), s) for s, w in by_stack.items()]
    return sorted(grouped, key=lambda ws: (-len(ws[0]), [_natural(w) for w in ws[0]]))


def _natural(text: str) -> list[Any]:
    """Sort key putting 'rank 2' before 'rank 10'."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def render(entries: list[tuple[str, str]], title: str = "") -> str:
    """The grouped text: a header per distinct stack naming who has it, then the stack."""
    lines = [title] if title else []
    for who, stack in group_stacks(entries):
        count = f"{len(who)} x " if len(who) > 1 else ""
        lines.append(f"--- {count}{'; '.join(who)}")
        lines.append(stack if stack else "  (idle: no call running)")
    return "\n".join(lines)


def collect(
    workers: Any = None, *, timeout: float = 5.0, include_driver: bool = True
) -> list[tuple[str, str]]:
    """[(who, stack)] of the driver's threads and of the workers in other processes.

    `workers` (a WorkerGroup) limits the remote part to that group's workers.
    """
    from .runtime import current_runtime_or_none

    entries: list[tuple[str, str]] = []
    if include_driver:
        entries += [(f"driver: {name}", s) for name, s in thread_stacks(skip_current=False)]
    runtime = current_runtime_or_none()
    backend = runtime.backend if runtime is not None else None
    if backend is not None:
        try:
            entries += backend.worker_stacks(workers, timeout)
        except Exception as exc:  # a debugging aid must not fail
            entries.append((f"({type(exc).__name__} while asking workers)", str(exc)))
    return entries


def dump_stacks(file: Any = None, *, timeout: float = 5.0) -> str:
    """Print (to `file`, default stderr) and return every Python stack of the run: the
    driver's threads and every worker's, grouped by identical stacks.

    Workers that do not answer within `timeout` seconds (dead, or stuck in C code holding the
    GIL) are listed as such. Works without a run too (then only this process's threads).
    """
    text = render(collect(timeout=timeout), "twinkle: Python stacks of the driver and workers")
    out = sys.stderr if file is None else file
    print(text, file=out, flush=True)
    return text


def note_for_timeout(exc: BaseException, workers: Any = None, timeout: float = 5.0) -> None:
    """Add the workers' (and driver's) grouped stacks to a `CallTimeoutError` as a note."""
    try:
        text = render(collect(workers, timeout=timeout), "twinkle: stacks when the call timed out")
    except Exception as error:  # never hide the timeout behind a failure to explain it
        text = f"twinkle: could not collect the stacks ({type(error).__name__}: {error})"
    notes = getattr(exc, "__notes__", None) or []
    exc.__notes__ = [*notes, text]


# ------------------------------------------------------------------------- SIGUSR1
_previous_handler: Any = None
_installed = False


def _on_signal(signum: int, frame: Any) -> None:
    # Dump from a thread: asking remote workers may take a while, and the signal may have
    # interrupted code that holds locks the collection needs.
    threading.Thread(target=dump_stacks, name="twinkle-dump-stacks", daemon=True).start()


def install_signal_handler() -> bool:
    """Dump stacks on SIGUSR1 (only when nobody else handles it, from the main thread)."""
    global _previous_handler, _installed
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or _installed or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(sig)
    if current not in (signal.SIG_DFL, None):
        log.debug("twinkle: SIGUSR1 already handled (%r); not dumping stacks on it", current)
        return False
    _previous_handler = current
    signal.signal(sig, _on_signal)
    _installed = True
    return True


def uninstall_signal_handler() -> None:
    """Put the SIGUSR1 handler back as it was before `install_signal_handler`."""
    global _installed
    sig = getattr(signal, "SIGUSR1", None)
    if not _installed or sig is None:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(sig) is _on_signal:
        signal.signal(sig, _previous_handler if _previous_handler is not None else signal.SIG_DFL)
    _installed = False
