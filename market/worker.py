"""`veritrain market worker`: run a Celery worker for the market (with the periodic tick by default).

Settings come from the environment (``VERITRAIN_*``); the flags here override them for this process
and are exported before :mod:`market.tasks` is imported, so the worker and its tasks agree.
"""

from __future__ import annotations

import argparse
import os
import sys

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
        argv.append("--beat")
        argv.append(f"--schedule={load_settings().data_dir / 'celerybeat-schedule'}")
    app.worker_main(argv)
    return 0
