"""The process supervisor stops exactly what it started, child processes included, and reports failures."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from apps.procs import ProcessGroup, free_port, http_ok, tcp_open
from veritrain.errors import ChildProcessExited, ReadinessTimeout

# A child that starts a grandchild (like npx or a Celery pool) and prints the grandchild's PID.
SPAWNS_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): treat it as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def test_stop_all_stops_children_and_grandchildren(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        proc = group.start("spawner", [sys.executable, "-c", SPAWNS_GRANDCHILD])
        group.wait_ready("spawner", lambda: proc.log_path.read_text().strip() != "", timeout=30)
        grandchild = int(proc.log_path.read_text().split()[0])
        assert _pid_alive(proc.pid) and _pid_alive(grandchild)
    assert not proc.alive()
    assert not _pid_alive(grandchild)


def test_exit_before_ready_raises_with_log_tail(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        group.start("crasher", [sys.executable, "-c", "import sys; print('boom: bad config'); sys.exit(3)"])
        with pytest.raises(ChildProcessExited, match="boom: bad config"):
            group.wait_ready("crasher", lambda: False, timeout=30)


def test_readiness_timeout(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        with pytest.raises(ReadinessTimeout):
            group.wait_ready("sleeper", lambda: False, timeout=0.5)


def test_kill_is_immediate_and_check_alive_names_the_dead(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        group.start("victim", [sys.executable, "-c", "import time; time.sleep(600)"])
        group.start("bystander", [sys.executable, "-c", "import time; time.sleep(600)"])
        group.kill("victim", signal.SIGKILL)
        assert group["victim"].returncode() == -signal.SIGKILL
        group.check_alive(["bystander"])
        with pytest.raises(ChildProcessExited, match="victim"):
            group.check_alive()


def test_health_probes_on_a_real_http_server(tmp_path: Path) -> None:
    port = free_port()
    assert not tcp_open("127.0.0.1", port)
    with ProcessGroup(tmp_path) as group:
        server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        group.start("http", server, cwd=tmp_path)
        group.wait_ready("http", lambda: http_ok(f"http://127.0.0.1:{port}/"), timeout=30)
        assert tcp_open("127.0.0.1", port)
    assert not tcp_open("127.0.0.1", port)


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    group = ProcessGroup(tmp_path)
    proc = group.start("stubborn", [sys.executable, "-c", stubborn])
    group.wait_ready("stubborn", lambda: "up" in proc.log_path.read_text(), timeout=30)
    group.stop_all(grace=0.5)
    assert proc.returncode() == -signal.SIGKILL
