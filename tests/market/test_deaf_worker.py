"""Regression (found by `veritrain bench chaos`, seed 26, Redis killed while the worker acked a task): the
Celery worker stayed connected to the restarted Redis but took no task again (78 queued, none received),
so the market's control plane stalled with every process alive. The worker now exits when its own beat's
ticks stop arriving, for its supervisor to start it again."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from needs import require

from apps.faultproxy import FaultProxy, LinkMode
from apps.procs import ProcessGroup, free_port
from market.worker import DEAF_EXIT_CODE, DeafWorkerWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_that_receives_no_task_for_the_limit_exits_for_its_supervisor() -> None:
    clock, exits = Clock(), []
    dog = DeafWorkerWatchdog(30.0, clock=clock, exit=exits.append)
    clock.now += 29.0
    assert not dog.check()
    dog.received(sender=None)  # a tick arrived: the countdown starts again
    clock.now += 29.0
    assert not dog.check() and exits == []
    dog.started(sender=None)  # a long task (a solo pool receives nothing meanwhile) is not deafness
    clock.now += 45.0
    assert not dog.check() and exits == []
    dog.finished(sender=None)
    clock.now += 31.0
    assert dog.check()
    assert exits == [DEAF_EXIT_CODE]


def test_a_real_worker_cut_off_from_its_broker_exits_with_the_deaf_code(tmp_path: Path) -> None:
    """`veritrain market worker` on a private Redis reached through a fault-proxy link: it runs its ticks,
    then the link is partitioned (no task can arrive) and the worker exits with DEAF_EXIT_CODE."""
    binary = shutil.which("redis-server")
    require(None if binary else "no redis-server on the PATH", "apt install redis-server")
    assert binary is not None
    redis_port = free_port()
    with ProcessGroup(tmp_path / "logs") as procs, FaultProxy() as proxy:
        procs.start(
            "redis", [binary, "--port", str(redis_port), "--save", "", "--appendonly", "no"], cwd=tmp_path
        )
        (port,) = proxy.open("worker", [("127.0.0.1", redis_port)])
        broker = f"redis://127.0.0.1:{port}/0"
        env = {
            "VERITRAIN_DATA_DIR": str(tmp_path / "market"),
            "VERITRAIN_BROKER_URL": broker,
            "VERITRAIN_RESULT_BACKEND_URL": broker,
            "VERITRAIN_TICK_S": "0.2",  # deaf after 15 ticks: 3 s
        }
        worker = procs.start(
            "worker", [sys.executable, "-m", "apps", "market", "worker"], env=env, cwd=tmp_path
        )
        procs.wait_ready("worker", lambda: "market.tick" in worker.log_tail(), timeout=60)
        time.sleep(5.0)  # ticking normally for longer than the 3 s limit: the watchdog leaves it alone
        assert worker.alive(), worker.log_tail()
        proxy.set_mode("worker", LinkMode("partition"))
        deadline = time.monotonic() + 60
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.returncode() == DEAF_EXIT_CODE, worker.log_tail()


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_embedded_beat_dies_with_a_worker_killed_outright(tmp_path: Path) -> None:
    """Found by the 200-run chaos bench: a worker that ended without its process group (its deaf exit 75,
    or SIGKILL of its pid) left its embedded beat (a child process) running for ever, ticking beside the
    beat of the worker started in its place."""
    require(None if sys.platform.startswith("linux") else "Linux only (prctl)", "run on Linux")
    env = {"VERITRAIN_DATA_DIR": str(tmp_path / "market"), "VERITRAIN_TICK_S": "0.2"}
    with ProcessGroup(tmp_path / "logs") as procs:
        worker = procs.start(
            "worker", [sys.executable, "-m", "apps", "market", "worker"], env=env, cwd=tmp_path
        )
        # the worker's banner names market.tick before the beat is forked: wait for the beat itself
        procs.wait_ready("worker", lambda: len(_children(worker.pid)) == 1, timeout=60)
        (beat,) = _children(worker.pid)
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, as a deaf worker's own exit 75 leaves it
        deadline = time.monotonic() + 10
        while _alive(beat) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(beat), f"the beat (pid {beat}) outlived its worker"
