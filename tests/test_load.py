"""The parameter server under sustained load: 10,000+ pushes from many client processes. The
server's process keeps a flat memory and thread count, and its throughput does not decay."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

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
    weights = [np.zeros(s, np.float32) for s in [(200, 256), (256,), (256, 64), (64,)]]
    secret = os.urandom(32)
    state = ServerState(weights, "asynchronous")
    state.begin_epoch(CLIENTS)
    server = ParameterServer(state, "127.0.0.1", secret).start()
    threads_before = threading.active_count()
    samples = []  # (seconds, updates, rss MiB, threads, open fds)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        procs = [
            subprocess.Popen([sys.executable, "-c", CLIENT, *map(str, server.address), secret.hex(), str(w), str(PUSHES_PER_CLIENT)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for w in range(CLIENTS)
        ]
        t0 = time.perf_counter()
        while any(p.poll() is None for p in procs):
            samples.append((time.perf_counter() - t0, state.stats.updates, rss_mb(), threading.active_count(),
                            len(os.listdir("/proc/self/fd"))))
            time.sleep(0.25)
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
    t, updates, rss, threads, fds = map(np.array, zip(*steady))
    rss_slope = slope(updates, rss) * 10_000  # MiB per 10,000 pushes
    half = len(steady) // 2
    rate_first = (updates[half] - updates[0]) / (t[half] - t[0])
    rate_last = (updates[-1] - updates[half]) / (t[-1] - t[half])
    report = (f"{total} pushes in {samples[-1][0]:.1f} s; RSS {rss.min():.0f}-{rss.max():.0f} MiB, slope {rss_slope:+.2f} MiB "
              f"per 10k pushes; threads {threads.min()}-{threads.max()} (before {threads_before}); fds {fds.min()}-{fds.max()}; "
              f"pushes/s first half {rate_first:.0f}, second half {rate_last:.0f}")
    print(report)
    assert abs(rss_slope) < 8, report  # a leak of one 280 KB delta per push would be 2,700 MiB
    assert threads.max() <= threads_before + CLIENTS + 1, report  # one thread per connected client
    assert fds.max() - fds.min() <= CLIENTS + 2, report
    assert rate_last > 0.6 * rate_first, report  # no decay (generous: the machine is shared)
    wait = time.monotonic() + 10
    while threading.active_count() > threads_before - 1 and time.monotonic() < wait:  # the accept thread is gone too
        time.sleep(0.05)
    assert threading.active_count() <= threads_before - 1, report
