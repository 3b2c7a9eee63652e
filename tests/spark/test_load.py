"""The parameter server under sustained load: 10,000+ pushes from many client processes. The
server's process keeps a flat memory and thread count, and its throughput does not decay."""

import ctypes
import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import ROOT

from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState

CLIENTS = 8
PUSHES_PER_CLIENT = 1300  # 10,400 in all

# a lightweight worker: no Keras, no Spark; push a delta and take the weights back, over and over
CLIENT = r"""
import sys, numpy as np
from sparkdl_train.ps.client import PSClient
host, port, secret, worker, n = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
shapes = [(200, 256), (256,), (256, 64), (64,)]
delta = [np.full(s, 1e-6, np.float32) for s in shapes]
with PSClient(host, port, secret, worker, timeout=120, connect_timeout=30) as c:
    version, _ = c.pull()
    for i in range(n):
        version, w = c.push(delta, version, 1)
    c.done()
print(version)
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def slope(xs, ys) -> float:
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


@pytest.mark.slow
def test_ten_thousand_pushes_from_many_processes_leave_memory_threads_and_speed_flat():
    # this process ran earlier tests (models, sessions): their garbage is collected and its freed heap given back to
    # the OS before the baseline, or its release mid-run reads as a falling RSS (a CI run measured -40 MiB per 10k
    # pushes while its xdist worker released an earlier test's memory)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    weights = [np.zeros(s, np.float32) for s in [(200, 256), (256,), (256, 64), (64,)]]
    secret = os.urandom(32)
    state = ServerState(weights, "asynchronous")
    state.begin_epoch(CLIENTS)
    server = ParameterServer(state, "127.0.0.1", secret).start()
    threads_before = threading.active_count()
    samples = []  # (seconds, updates, rss MiB, threads, open fds, this process's CPU seconds: the server's)
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        procs = [
            subprocess.Popen([sys.executable, "-c", CLIENT, *map(str, server.address), secret.hex(), str(w), str(PUSHES_PER_CLIENT)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for w in range(CLIENTS)
        ]
        t0 = time.perf_counter()
        while any(p.poll() is None for p in procs):
            samples.append((time.perf_counter() - t0, state.stats.updates, rss_mb(), threading.active_count(),
                            len(os.listdir("/proc/self/fd")), time.process_time()))
            time.sleep(0.05)  # the run takes 2.5 s on a fast machine: enough samples to judge its trend
            assert time.perf_counter() - t0 < 600, "the load test hung"
        outs = [p.communicate(timeout=30) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    finally:
        server.stop()
    total = CLIENTS * PUSHES_PER_CLIENT
    assert state.stats.updates == total and state.stats.rejected_connections == 0
    assert sum(state.stats.worker_samples.values()) == total
    np.testing.assert_allclose(state.snapshot()[0], total * 1e-6, rtol=1e-3)  # every delta applied once

    # steady state: from 10% to 100% of the pushes (start-up and imports excluded)
    steady = [s for s in samples if total * 0.1 <= s[1] < total]
    assert len(steady) >= 8, f"too few samples ({len(steady)}): the run was too quick to judge"
    t, updates, rss, threads, fds, cpu = map(np.array, zip(*steady))
    rss_slope = slope(updates, rss) * 10_000  # MiB per 10,000 pushes
    half = len(steady) // 2
    rate_first = (updates[half] - updates[0]) / (t[half] - t[0])
    rate_last = (updates[-1] - updates[half]) / (t[-1] - t[half])
    # the server's cost per push (this process's CPU time: its handler threads, and the sampling loop's constant
    # share), which other processes on a shared machine do not change as they change the wall-clock rate (a CI
    # run halved the second half's pushes/s while the other xdist worker started a YARN cluster)
    cpu_first = (cpu[half] - cpu[0]) / max(updates[half] - updates[0], 1) * 1e6
    cpu_last = (cpu[-1] - cpu[half]) / max(updates[-1] - updates[half], 1) * 1e6
    report = (f"{total} pushes in {samples[-1][0]:.1f} s; RSS {rss.min():.0f}-{rss.max():.0f} MiB, slope {rss_slope:+.2f} MiB "
              f"per 10k pushes; threads {threads.min()}-{threads.max()} (before {threads_before}); fds {fds.min()}-{fds.max()}; "
              f"pushes/s first half {rate_first:.0f}, second half {rate_last:.0f}; server CPU per push {cpu_first:.0f} us, "
              f"then {cpu_last:.0f} us")
    print(report)
    assert abs(rss_slope) < 8, report  # a leak of one 280 KB delta per push would be 2,700 MiB
    assert threads.max() <= threads_before + CLIENTS + 1, report  # one thread per connected client
    assert fds.max() - fds.min() <= CLIENTS + 2, report
    assert cpu_last < 1.5 * cpu_first, report  # no decay: a push costs the server no more as pushes accumulate
    wait = time.monotonic() + 10
    while threading.active_count() > threads_before - 1 and time.monotonic() < wait:  # the accept thread is gone too
        time.sleep(0.05)
    assert threading.active_count() <= threads_before - 1, report


def jvm_heap_used_mb(sc) -> float:
    sc._jvm.java.lang.System.gc()
    rt = sc._jvm.java.lang.Runtime.getRuntime()
    return (rt.totalMemory() - rt.freeMemory()) / 2**20


@pytest.mark.soak
def test_two_hundred_short_fits_in_one_session_leave_nothing_behind(sc, digits):
    """200 short fits, cycling model averaging, the asynchronous parameter server and the ring (half
    of them with live reports): threads, sockets, cached RDDs, driver memory and JVM heap stay flat."""
    import gc

    from helpers import make_mlp

    from sparkdl_train import SparkModel, to_simple_rdd

    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:128], y[:128], 2)
    model = make_mlp()
    modes = [{"mode": "synchronous"}, {"mode": "asynchronous", "frequency": "batch"}, {"mode": "allreduce"}]
    rows = []  # (fit, threads, fds, cached RDDs, RSS MiB, JVM heap MiB)
    t0 = time.perf_counter()
    for i in range(200):
        SparkModel(model, num_workers=2, **modes[i % 3]).fit(rdd, epochs=1, batch_size=64, verbose=i % 2)
        if i % 10 == 9:
            gc.collect()
            rows.append((i + 1, threading.active_count(), len(os.listdir("/proc/self/fd")),
                         sc._jsc.sc().getPersistentRDDs().size(), rss_mb(), jvm_heap_used_mb(sc)))
    seconds = time.perf_counter() - t0
    fits, threads, fds, cached, rss, heap = map(np.array, zip(*rows))
    warm = fits >= 30  # the first fits load TensorFlow's and Spark's caches
    rss_slope, heap_slope = slope(fits[warm], rss[warm]) * 100, slope(fits[warm], heap[warm]) * 100
    report = (f"200 fits in {seconds:.0f} s; threads {threads.min()}-{threads.max()}, fds {fds.min()}-{fds.max()}, cached RDDs "
              f"{cached.min()}-{cached.max()}, driver RSS {rss[warm].min():.0f}-{rss.max():.0f} MiB (slope {rss_slope:+.1f} MiB "
              f"per 100 fits), JVM heap {heap.min():.0f}-{heap.max():.0f} MiB (slope {heap_slope:+.1f} MiB per 100 fits)")
    print(report)
    assert threads.max() == threads.min() and [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-")] == []
    assert fds[warm].max() - fds[warm].min() <= 4, report
    assert cached.max() == cached.min(), report
    assert rss_slope < 30, report  # Keras/TF keep some per-model caches; a leak of a fit's state would be far more
    assert heap_slope < 20, report
