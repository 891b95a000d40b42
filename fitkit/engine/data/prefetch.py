"""Reading the next batches in a background thread while the current step runs.

A DataLoader with `num_workers=0` runs each batch's `__getitem__` and collation on the thread
that trains, between steps. `read_ahead` moves that work to one daemon thread named
"fitkit-prefetch", which stays at most `DEPTH` batches ahead (plus the one it is building)::

    iterator = iter(loader)
    first = next(iterator)                      # on this thread: a sampler seeds here
    for batch in read_ahead(first, iterator, readers=readers, on_draws=fall_back):
        step(batch)                             # batches 3, 4, ... are read meanwhile

The batches come in the same order. The rule that keeps a run's random numbers exact: the
first two batches of each pass are read on the calling thread, and when reading the second one
moved a global generator (torch's CPU one, Python's `random`, NumPy's global one), the dataset
draws from them (augmentation): `on_draws` is called and the pass goes on without a thread,
since a thread drawing while the step draws (dropout) would interleave by chance. The first
batch is not the test: a sampler without a generator of its own seeds itself from the global
one when the first batch is read. A pass whose second batch took less than `MIN_READ_S` to
read is read on the calling thread too: not worth a thread. An error raised while reading is
raised on the consumer's thread at the batch where it happened; closing the iterator (or
`stopping` a source) ends the thread.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import queue
import random
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator, MutableSet
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from fitkit.engine.data.collate import collate_samples, default_data_collator

THREAD_NAME = "fitkit-prefetch"
DEPTH = 1  # batches waiting in the queue; the thread builds one more meanwhile
_POLL_S = 0.05  # how often a producer waiting for room looks at its stop flag
_JOIN_S = 10.0  # how long closing waits for the batch being read to finish
# A batch read faster than this stays on the calling thread: handing batches between two threads
# that both run Python costs about 0.3 ms a step (they take turns holding the GIL), more than
# overlapping so short a read saves.
MIN_READ_S = 1e-3
# An evaluation or prediction pass (`read_ahead(..., min_step_s=MIN_STEP_S)`) reads ahead only
# when the step on its second batch took this long too: a forward shorter than the handoff and
# the GIL turns it costs hides less than they cost (a hand-written loop reads between steps).
MIN_STEP_S = 1e-3

_ITEM, _ERROR, _END = "item", "error", "end"  # what the thread hands over
_NONE = object()  # `rest` had no second item
_DICT_COLLATIONS = (default_data_collator, collate_samples)  # fitkit's own, as HF's default collation


def can_prefetch(loader: Any) -> bool:
    """Whether batches of `loader` are worth reading ahead: a DataLoader over a map-style Dataset
    with `num_workers=0` (worker processes already read ahead; an IterableDataset's iterator is
    the user's own code, which may hold state bound to the thread that created it)."""
    return (isinstance(loader, DataLoader) and loader.num_workers == 0
            and not isinstance(loader.dataset, IterableDataset) and not _holds_the_gil(loader.collate_fn))


def _holds_the_gil(collate_fn: Any) -> bool:
    """True for Hugging Face's data collators (`transformers.DataCollator*` objects and functions
    such as `default_data_collator`) and fitkit's own collation of dict samples, which does what
    `default_data_collator` does: their padding and list-to-tensor conversion is Python that holds
    the GIL, so a thread collating beside the step slows the step more than it hides (measured: a
    tiny BERT with `DataCollatorWithPadding` stepped in 25.5 ms with prefetching against 19.8 ms
    without; a tiny Llama with `default_data_collator` spent 0.8 ms more CPU a step with the
    thread). Reads that mostly run in torch ops (per-item transforms) release it."""
    while isinstance(collate_fn, functools.partial):
        collate_fn = collate_fn.func
    if isinstance(collate_fn, (types.FunctionType, types.MethodType)):
        if collate_fn in _DICT_COLLATIONS:
            return True
        module = collate_fn.__module__ or ""
    else:
        module = type(collate_fn).__module__
    return module.split(".")[0] == "transformers"


class Prefetcher:
    """The items of `iterator`, read by a daemon thread at most `depth` items ahead, in order.

    The thread holds no reference to this object: dropping it (or `close()`) stops the thread.
    """

    def __init__(self, iterator: Iterator, depth: int = DEPTH, name: str = THREAD_NAME):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_produce, args=(iterator, self._queue, self._stop), name=name,
                                        daemon=True)
        self._thread.start()
        _stop_at_exit(self)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            if hasattr(value, "add_note"):  # Python 3.11+
                value.add_note(f"(raised in the {self._thread.name!r} thread, which reads batches ahead; "
                               "prefetch=False reads them on the training thread)")
            raise value  # its traceback, from the thread, is kept
        raise StopIteration

    def close(self) -> None:
        """Stop the thread: it finishes the item it is reading, if any, and ends."""
        self._done = True
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:  # drop what was read ahead now, not when this object goes
                self._queue.get_nowait()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


_live: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


def _stop_at_exit(reader: Prefetcher) -> None:
    """Close `reader` at interpreter exit if nothing closed it. A daemon thread still inside a
    torch call when the interpreter finalizes is ended there by `pthread_exit`, whose unwinding
    through torch's noexcept frames aborts the process ("terminate called without an active
    exception"). Registered on first use, so it runs before the exit teardown of the process
    group (`engine/fabric.py`), which was registered earlier (atexit runs last-in, first-out)."""
    if not _live and not getattr(_stop_at_exit, "registered", False):
        atexit.register(_close_all)
        _stop_at_exit.registered = True  # type: ignore[attr-defined]
    _live.add(reader)


def _close_all() -> None:
    for reader in list(_live):
        reader.close()


def _produce(iterator: Iterator, out: queue.Queue, stop: threading.Event) -> None:
    """The thread: put every item of `iterator`, then an end mark (or the error that ended it)."""
    try:
        for item in iterator:
            if stop.is_set() or not _put(out, (_ITEM, item), stop):
                return
    except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
        _put(out, (_ERROR, error), stop)
        return
    _put(out, (_END, None), stop)


def _put(out: queue.Queue, message: tuple, stop: threading.Event) -> bool:
    """Put `message` once there is room; False when told to stop first."""
    while not stop.is_set():
        try:
            out.put(message, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def rng_fingerprint() -> tuple:
    """The states of the global generators a Dataset may draw from: torch's CPU one, Python's
    `random` and (when imported) NumPy's legacy global one."""
    numpy = sys.modules.get("numpy")
    state: tuple = ()
    if numpy is not None:
        _, keys, position, has_gauss, gauss = numpy.random.get_state()
        state = (keys.tobytes(), position, has_gauss, gauss)
    return torch.get_rng_state(), random.getstate(), state


def _same(before: tuple, after: tuple) -> bool:
    return torch.equal(before[0], after[0]) and before[1:] == after[1:]


def read_ahead(first: Any, rest: Iterator, *, readers: MutableSet, on_draws: Callable[[], None],
               min_step_s: float = 0.0) -> Iterator:
    """`first`, then the items of `rest`: the second one read on this thread, the others by a
    `Prefetcher` (added to `readers`), unless reading the second moved a global generator (then
    `on_draws()` is called) or took less than `MIN_READ_S`: then every item is read on this
    thread, as without prefetching. With `min_step_s`, the thread starts after the consumer's
    step on the second item, and only when that step took at least `min_step_s`."""
    yield first
    before, started = rng_fingerprint(), time.perf_counter()
    second = next(rest, _NONE)
    if second is _NONE:
        return
    quick = time.perf_counter() - started < MIN_READ_S
    drew = not _same(before, rng_fingerprint())
    if drew or quick:
        if drew:
            on_draws()
        yield second
        yield from rest
        return
    if min_step_s:  # the consumer's step on the second item decides
        stepped = time.perf_counter()
        yield second
        if time.perf_counter() - stepped < min_step_s:
            yield from rest
            return
    reader = Prefetcher(rest)  # without `min_step_s`: reads the third item while the consumer steps on the second
    readers.add(reader)
    try:
        if not min_step_s:
            yield second
        yield from reader
    finally:
        reader.close()


@contextlib.contextmanager
def stopping(*sources: Any) -> Iterator[None]:
    """Stop the prefetch threads of `sources` (objects with a `stop_prefetch()`) when the block
    ends, an exception included: its traceback would otherwise keep their iterators alive."""
    try:
        yield
    finally:
        for source in sources:
            stop = getattr(source, "stop_prefetch", None)
            if stop is not None:
                stop()
