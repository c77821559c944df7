"""MicroBatcher: concurrent single calls gathered into batches."""

import doctest
import threading
import time

import pytest

from bat_gym.policies import batching
from bat_gym.policies.batching import BatcherClosed, MicroBatcher


def run_threads(fn, items):
    results = [None] * len(items)
    barrier = threading.Barrier(len(items))

    def worker(i):
        barrier.wait()
        try:
            results[i] = fn(items[i])
        except Exception as exc:  # collected for the assertion
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_the_module_doctest_runs():
    assert doctest.testmod(batching).failed == 0


def test_concurrent_calls_share_batches_up_to_the_size_limit():
    sizes = []

    def square(xs):
        sizes.append(len(xs))
        return [x * x for x in xs]

    with MicroBatcher(square, max_batch_size=3, wait_s=0.3) as b:
        results = run_threads(b, list(range(7)))
    assert results == [x * x for x in range(7)]
    assert sum(sizes) == 7 and max(sizes) <= 3 and len(sizes) < 7
    assert (b.batches_run, b.items_run) == (len(sizes), 7)


def test_a_lone_call_waits_at_most_wait_s():
    with MicroBatcher(lambda xs: xs, wait_s=0.05) as b:
        started = time.monotonic()
        assert b("x") == "x"
    assert time.monotonic() - started < 2


def test_a_failing_batch_fails_each_of_its_callers_and_the_next_batch_runs():
    broken = True

    def explode(xs):
        if broken:
            raise RuntimeError("engine fell over")
        return xs

    with MicroBatcher(explode, max_batch_size=4, wait_s=0.3) as b:
        results = run_threads(b, ["a", "b", "c"])
        assert all(isinstance(r, RuntimeError) for r in results)
        broken = False
        assert b("fine") == "fine"


def test_a_wrong_number_of_results_is_an_error():
    with (
        MicroBatcher(lambda xs: [], wait_s=0) as b,
        pytest.raises(RuntimeError, match="0 results for 1"),
    ):
        b(1)


def test_closed_batchers_refuse_work_and_bad_settings_fail_early():
    b = MicroBatcher(lambda xs: xs)
    b.close()
    with pytest.raises(BatcherClosed):
        b.submit(1)
    with pytest.raises(ValueError, match="max_batch_size"):
        MicroBatcher(lambda xs: xs, max_batch_size=0)
    with pytest.raises(ValueError, match="wait_s"):
        MicroBatcher(lambda xs: xs, wait_s=-1)
