"""Start, health-check and stop child processes by PID, one log file per process.

Why a module of its own: the demo and the end-to-end tests run a whole marketplace as separate processes
(chain node, market API, Celery worker, agents). Every one of them must be stopped at the end — also on
Ctrl-C or a failed check — and only the processes we started (by their own PID / process group, never by
name). Each child runs in a new session so that its own children (npx shells, Celery pool workers) are
stopped together with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from veritrain.errors import ChildProcessExited, ProcessError, ReadinessTimeout

LOG_TAIL_BYTES = 4000


@dataclass
class ManagedProcess:
    """One child process: its name (unique in its group), command line, log file and Popen handle."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, max_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the process's log, for error messages that show why a child failed."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


class ProcessGroup:
    """The set of child processes of one orchestrator; a context manager that stops them all on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, ManagedProcess] = {}

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def __getitem__(self, name: str) -> ManagedProcess:
        return self._procs[name]

    def __iter__(self) -> Iterator[ManagedProcess]:
        return iter(list(self._procs.values()))

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """Start `argv` in its own session with stdout+stderr appended to `<log_dir>/<name>.log`."""
        existing = self._procs.get(name)
        if existing is not None and existing.alive():
            raise ProcessError(f"a process named {name!r} is already running (pid {existing.pid})")
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            popen = subprocess.Popen(
                list(argv),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=str(cwd) if cwd else None,
                start_new_session=True,
            )
        except OSError as err:
            log_file.close()
            raise ProcessError(f"cannot start {name}: {argv[0]}: {err}") from err
        proc = ManagedProcess(name=name, argv=list(argv), log_path=log_path, popen=popen, log_file=log_file)
        self._procs[name] = proc
        return proc

    def wait_ready(self, name: str, probe: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
        """Poll `probe` until it returns True; fail fast if the process exits, or after `timeout` seconds."""
        proc = self._procs[name]
        deadline = time.monotonic() + timeout
        while True:
            if not proc.alive():
                raise ChildProcessExited(
                    f"{name} (pid {proc.pid}) exited with code {proc.returncode()} before it was ready; "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )
            if probe():
                return
            if time.monotonic() > deadline:
                raise ReadinessTimeout(
                    f"{name} (pid {proc.pid}) not ready after {timeout:.0f} s; log {proc.log_path}:\n"
                    f"{proc.log_tail()}"
                )
            time.sleep(interval)

    def check_alive(self, names: Sequence[str] | None = None) -> None:
        """Raise ChildProcessExited naming the first listed (default: every) process that has exited."""
        for proc in self:
            if names is not None and proc.name not in names:
                continue
            if not proc.alive():
                raise ChildProcessExited(
                    f"{proc.name} (pid {proc.pid}) exited with code {proc.returncode()}; "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the process group of one child (used by tests to crash an agent mid-unit)."""
        proc = self._procs[name]
        if proc.alive():
            _signal_group(proc.pid, sig)
            proc.popen.wait(timeout=10)
        proc.log_file.close()

    def send(self, name: str, sig: signal.Signals) -> None:
        """Send `sig` to the process group of one child without waiting (SIGSTOP/SIGCONT: a frozen host)."""
        proc = self._procs[name]
        if proc.alive():
            _signal_group(proc.pid, sig)

    def stop(self, name: str, grace: float = 5.0) -> int | None:
        """SIGTERM the child's process group, SIGKILL after `grace` seconds; return its exit code."""
        proc = self._procs[name]
        if proc.alive():
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        # The leader may be gone while its group lives on (e.g. a Celery pool child): clean that up too.
        _signal_group(proc.pid, signal.SIGKILL)
        proc.log_file.close()
        return proc.returncode()

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every child: SIGTERM to all at once, SIGKILL to whatever still runs after `grace` seconds.

        Further SIGINT/SIGTERM are ignored meanwhile (in the main thread), so an impatient second Ctrl-C
        cannot abort the clean-up half-way and leave orphans behind."""
        with signals_ignored():
            procs = list(reversed(list(self._procs.values())))
            for proc in procs:
                if proc.alive():
                    _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            for proc in procs:
                # The leader may be gone while its group lives on (e.g. a Celery pool child).
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)
                _wait_group_gone(proc.pid, timeout=10)
                proc.log_file.close()


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM for the duration (only possible, and only needed, in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group `pgid`, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                # Fields after the parenthesised command name: state, ppid, pgrp, ...
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _wait_group_gone(pgid: int, timeout: float) -> None:
    """Wait until SIGKILL has taken effect on every member of the group: signal delivery is asynchronous,
    and an orphaned grandchild is not ours to wait() for. Without /proc there is nothing to poll."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by `pid` (our child started it with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when GET `url` answers with a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while active, so `finally` blocks stop our children (main thread
    only: signal handlers cannot be set elsewhere, and there the thread's owner handles shutdown)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
