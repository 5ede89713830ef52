"""`veritrain market worker`: run a Celery worker for the market (with the periodic tick by default).

Settings come from the environment (``VERITRAIN_*``); the flags here override them for this process
and are exported before :mod:`market.tasks` is imported, so the worker and its tasks agree.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEAF_AFTER_TICKS = 15  # no task received for 15 ticks (30 s by default) while our own beat sends one a tick
DEAF_EXIT_CODE = 75  # EX_TEMPFAIL: a supervisor should start the worker again
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_the_worker(worker_pid: int, **_: object) -> None:
    """In the embedded beat (a child process of the worker `worker_pid`): have the kernel SIGTERM it when
    the worker dies. Why: a worker killed outright (SIGKILL, the OOM killer) left its beat running for
    ever, sending ticks beside the beat of the worker its supervisor starts again (the 200-run chaos bench
    found three such orphans, one still ticking at a Redis gone for an hour). The worker's pid comes from
    the worker, not from getppid() here: a worker killed between forking the beat and this call would
    already have left it to the reaper (found by CI: the beat outlived a worker killed that early)."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != worker_pid:  # the worker died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


class DeafWorkerWatchdog:
    """Ends a worker that has received no task for `limit_s` although its own beat sends a tick every few
    seconds. Why: after a Redis restart a Celery worker can stay connected yet stop consuming (celery
    issues 9054, 10302; bench chaos saw 78 tasks queued and none taken), which stalls the whole control
    plane. The market's state is in its database and its tasks are idempotent, so exiting for the
    supervisor to restart is safe; staying up is not."""

    def __init__(
        self,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.limit_s = limit_s
        self.clock = clock
        self.exit = exit
        self.last_received = clock()
        self.running = 0  # tasks running in this process (a solo pool receives nothing while one runs)

    def received(self, **_: object) -> None:
        """celery.signals.task_received (the consumer took a message off the queue) or worker_ready."""
        self.last_received = self.clock()

    def started(self, **_: object) -> None:
        self.running += 1

    def finished(self, **_: object) -> None:
        self.running = max(0, self.running - 1)
        self.received()

    def check(self) -> bool:
        """Exit (and return True) when the worker has been deaf, not busy, for longer than the limit."""
        silent_s = self.clock() - self.last_received
        if self.running or silent_s <= self.limit_s:
            return False
        log.error("no task received for %.0f s although the beat ticks: deaf worker, exiting", silent_s)
        self.exit(DEAF_EXIT_CODE)
        return True

    def start(self) -> None:
        from celery.signals import task_postrun, task_prerun, task_received, worker_ready

        task_received.connect(self.received, weak=False)
        worker_ready.connect(self.received, weak=False)  # a slow start is not silence
        task_prerun.connect(self.started, weak=False)  # nor a long task (up to its 60 s time limit)
        task_postrun.connect(self.finished, weak=False)

        def watch() -> None:
            while not self.check():
                time.sleep(self.limit_s / 10)

        threading.Thread(target=watch, name="deaf-worker-watchdog", daemon=True).start()


OVERRIDES = {
    "database_url": "VERITRAIN_DATABASE_URL",
    "broker_url": "VERITRAIN_BROKER_URL",
    "result_backend_url": "VERITRAIN_RESULT_BACKEND_URL",
    "data_dir": "VERITRAIN_DATA_DIR",
    "chain_factory": "VERITRAIN_CHAIN_FACTORY",
    "queue": "VERITRAIN_CELERY_QUEUE",
    "keystore": "VERITRAIN_KEYSTORE",
    "password_env": "VERITRAIN_KEYSTORE_PASSWORD_ENV",
    "metrics_port": "VERITRAIN_METRICS_PORT",
    "metrics_host": "VERITRAIN_METRICS_HOST",
}


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """The market operator's key, shared by `market serve` and `market worker`."""
    parser.add_argument(
        "--keystore", help="the operator's keystore (`veritrain keys new`); default: $VERITRAIN_KEYSTORE"
    )
    parser.add_argument(
        "--password-env",
        metavar="VAR",
        help="environment variable holding the keystore passphrase (default VERITRAIN_KEYSTORE_PASSWORD)",
    )


def apply_overrides(args: argparse.Namespace) -> None:
    """Export the flags as VERITRAIN_* variables (before settings are read) and unlock the operator key
    now, where a prompt can still be answered; the tasks reuse the unlocked key."""
    for attribute, variable in OVERRIDES.items():
        value = getattr(args, attribute, None)
        if value:
            os.environ[variable] = str(value)
    from market.runtime import load_chain_key
    from veritrain.settings import load_settings

    load_chain_key(load_settings())


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir)")
    parser.add_argument("--broker-url", help="Celery broker (default: filesystem:// in the data dir)")
    parser.add_argument(
        "--result-backend-url", help="Celery result backend (default: file:// in the data dir)"
    )
    parser.add_argument("--data-dir", help="folder for the embedded database, broker and results")
    parser.add_argument("--chain-factory", help="module:callable building the chain port from the settings")
    parser.add_argument("--queue", help="Celery queue name (default veritrain-market)")
    add_operator_arguments(parser)
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: off)")
    parser.add_argument("--metrics-host", help="address /metrics listens on (default 127.0.0.1)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pool", default="solo", choices=["solo", "prefork", "threads"])
    parser.add_argument("--no-beat", action="store_true", help="do not run the periodic market tick here")
    parser.add_argument("--loglevel", default="INFO")


def run(args: argparse.Namespace) -> int:
    apply_overrides(args)
    from veritrain.settings import load_settings

    settings = load_settings()
    settings.ensure_dirs()
    if settings.metrics_port:
        if args.pool == "prefork":  # tasks would count in child processes this endpoint cannot see
            print("veritrain market worker: --metrics-port needs --pool solo or threads", file=sys.stderr)
            return 2
        from prometheus_client import start_http_server

        from market.metrics import WORKER_REGISTRY

        start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=WORKER_REGISTRY)
    from market.tasks import app

    argv = [
        "worker",
        f"--loglevel={args.loglevel}",
        f"--concurrency={args.concurrency}",
        f"--pool={args.pool}",
        "--without-mingle",  # both talk over the remote-control broadcast, which the market does not use
        "--without-gossip",
    ]
    if not args.no_beat:
        from celery.signals import beat_embedded_init

        beat_embedded_init.connect(functools.partial(die_with_the_worker, os.getpid()), weak=False)
        argv.append("--beat")
        argv.append(f"--schedule={load_settings().data_dir / 'celerybeat-schedule'}")
        DeafWorkerWatchdog(DEAF_AFTER_TICKS * settings.tick_s).start()  # only our own beat makes silence news
    app.worker_main(argv)
    return 0
