"""A dynamic micro-batcher: concurrent single calls in, one batched call out.

The evaluation harness and the GRPO rollouts play many episodes at once, each in its
own thread, and each thread asks the policy for one message at a time. A local model
answers a batch of 8 prompts in about the time it takes to answer one, so a backend
wraps its ``act_batch`` in a :class:`MicroBatcher`: every ``submit`` lands in a queue,
and one worker thread takes the first waiting request, waits up to ``wait_s`` for
more (or until ``max_batch_size`` are waiting), and runs them as one batch.

>>> calls = []
>>> def double(xs):
...     calls.append(len(xs))
...     return [2 * x for x in xs]
>>> with MicroBatcher(double, max_batch_size=4, wait_s=0.0) as batcher:
...     batcher(21)
42
>>> calls
[1]
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from bat_gym.core.errors import ConfigError

__all__ = ["BatcherClosed", "MicroBatcher"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class BatcherClosed(RuntimeError):
    """The batcher was closed before it could run the request."""


class MicroBatcher(Generic[ItemT, ResultT]):
    """Gathers concurrent single requests into batches for one batch function.

    Args:
        batch_fn: maps a list of items to a list of results, in order and of the same
            length. It runs on the batcher's worker thread, one batch at a time, so it
            need not be thread-safe against itself.
        max_batch_size: the most items one call of ``batch_fn`` gets (>= 1).
        wait_s: seconds the worker waits, after the first item of a batch arrives,
            for more items to join it (>= 0). 0 batches only what is already queued.
        name: the worker thread's name, for debuggers and thread dumps.

    The worker thread starts on the first :meth:`submit`, so a batcher that is never
    used costs nothing. If ``batch_fn`` raises, every item of that batch gets the
    exception; later batches run normally.

    Attributes:
        batches_run: calls made to ``batch_fn`` so far.
        items_run: items passed to ``batch_fn`` so far.
    """

    def __init__(
        self,
        batch_fn: Callable[[list[ItemT]], Sequence[ResultT]],
        *,
        max_batch_size: int = 8,
        wait_s: float = 0.01,
        name: str = "bat-gym-batcher",
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if wait_s < 0:
            raise ConfigError(f"wait_s must be >= 0, got {wait_s}")
        self.batch_fn = batch_fn
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.name = name
        self.batches_run = 0
        self.items_run = 0
        # None is the shutdown sentinel; real entries are (item, future) pairs.
        self._queue: queue.Queue[tuple[ItemT, Future[ResultT]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, item: ItemT) -> Future[ResultT]:
        """Queue one item; the future resolves when its batch has run.

        Raises:
            BatcherClosed: :meth:`close` was called.
        """
        future: Future[ResultT] = Future()
        with self._lock:
            if self._closed:
                raise BatcherClosed(f"{self.name} is closed; it accepts no more requests")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put((item, future))
        return future

    def __call__(self, item: ItemT) -> ResultT:
        """Submit one item and wait for its result (re-raising the batch's exception)."""
        return self.submit(item).result()

    def close(self, timeout_s: float | None = 10.0) -> None:
        """Stop accepting items, run the ones already queued, and stop the worker thread.

        Args:
            timeout_s: how long to wait for the worker to finish what is queued.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> MicroBatcher[ItemT, ResultT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker --------------------------------------------------------------------

    def _gather(self, first: tuple[ItemT, Future[ResultT]]) -> tuple[list, bool]:
        """Collect up to ``max_batch_size`` entries, waiting at most ``wait_s``.

        Returns the entries and whether the shutdown sentinel was seen.
        """
        batch = [first]
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            try:
                entry = (
                    self._queue.get(timeout=remaining)
                    if remaining > 0
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                break
            if entry is None:
                return batch, True
            batch.append(entry)
        return batch, False

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            batch, stopping = self._gather(first)
            # A future cancelled by its caller while queued is dropped, not run.
            live = [(item, fut) for item, fut in batch if fut.set_running_or_notify_cancel()]
            if live:
                self._run_batch(live)

    def _run_batch(self, batch: list[tuple[ItemT, Future[ResultT]]]) -> None:
        items = [item for item, _ in batch]
        self.batches_run += 1
        self.items_run += len(items)
        try:
            results = list(self.batch_fn(items))
            if len(results) != len(items):
                raise RuntimeError(
                    f"{self.name}: the batch function returned {len(results)} results "
                    f"for {len(items)} items"
                )
        except BaseException as exc:  # every waiter must hear about the failure
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            fut.set_result(result)
