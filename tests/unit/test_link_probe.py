"""bench.net.probe, the link probe bench.net.links runs in the hosts' namespaces, on the loopback: both
sides in one process, and the server as the command the benchmark starts."""

import subprocess
import sys
import threading

import pytest

from bench.harness import results
from bench.net import probe


def test_the_probe_measures_a_round_trip_and_streams_whole_blocks_to_an_acknowledgement():
    srv = probe.listener("127.0.0.1")
    t = threading.Thread(target=probe.serve, args=(srv,), daemon=True)
    t.start()
    rtt, sent, seconds = probe.send("127.0.0.1", srv.getsockname()[1], 3 * probe.BLOCK + 1)
    t.join(10)
    assert not t.is_alive() and srv.fileno() == -1  # one sender answered, the listener closed
    assert sent == 4 * probe.BLOCK and 0 < rtt < 0.1 and seconds > 0


def test_the_server_command_prints_its_port_and_answers_one_sender():
    server = subprocess.Popen([sys.executable, "-m", "bench.net.probe", "serve", "127.0.0.1"], stdout=subprocess.PIPE,
                              text=True, cwd=results.ROOT)
    try:
        port = int(server.stdout.readline())
        out = subprocess.run([sys.executable, "-m", "bench.net.probe", "send", "127.0.0.1", str(port), str(probe.BLOCK)],
                             capture_output=True, text=True, timeout=60, check=True, cwd=results.ROOT).stdout.split()
        assert server.wait(30) == 0
    finally:
        server.kill()
    assert len(out) == 3 and int(out[1]) == probe.BLOCK and float(out[0]) > 0


def test_the_command_names_its_usage():
    with pytest.raises(SystemExit, match="usage: python -m bench.net.probe serve ADDRESS"):
        probe.main(["listen"])
