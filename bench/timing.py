"""The timing loop every round-trip measurement uses, on our side and the baselines'.

Stdlib-only and Python 3.8-compatible: the benchmark inlines this file's source at the
top of the scripts it runs through the sandbox, and the baseline clients import it, so
both sides of every comparison are timed by the same code.
"""

import threading
import time


def time_calls(call, calls, callers=1, warmup=0):
    """Time ``calls`` calls of ``call(i)`` spread over ``callers`` threads.

    ``warmup`` untimed calls come first, from one thread. Returns a dict: ``lat_ns``,
    each call's round trip in nanoseconds, and ``wall_ns``, from the moment every timed
    caller was released to the moment the last one finished. ``call`` raises to report
    a wrong answer; the first error of any thread is raised here.
    """
    clock = time.perf_counter_ns
    for i in range(warmup):
        call(i)
    per_caller = [calls // callers + (1 if k < calls % callers else 0) for k in range(callers)]
    results = [[] for _ in range(callers)]  # type: list[list[int]]
    errors = []
    start = threading.Barrier(callers + 1)

    def caller(k):
        lat = results[k]
        base = sum(per_caller[:k])
        try:
            start.wait()
            for i in range(base, base + per_caller[k]):
                t0 = clock()
                call(i)
                lat.append(clock() - t0)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    if callers == 1:
        lat = results[0]
        began = clock()
        for i in range(calls):
            t0 = clock()
            call(i)
            lat.append(clock() - t0)
        wall = clock() - began
    else:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
        for t in threads:
            t.start()
        start.wait()
        began = clock()
        for t in threads:
            t.join()
        wall = clock() - began
        if errors:
            raise errors[0]
    return {"lat_ns": [x for lat in results for x in lat], "wall_ns": wall}
