"""`veritrain market worker`: run a Celery worker for the market (with the periodic tick by default).

Settings come from the environment (``VERITRAIN_*``); the flags here override them for this process
and are exported before :mod:`market.tasks` is imported, so the worker and its tasks agree.
"""

from __future__ import annotations

import argparse
import os

OVERRIDES = {
    "database_url": "VERITRAIN_DATABASE_URL",
    "broker_url": "VERITRAIN_BROKER_URL",
    "result_backend_url": "VERITRAIN_RESULT_BACKEND_URL",
    "data_dir": "VERITRAIN_DATA_DIR",
    "chain_factory": "VERITRAIN_CHAIN_FACTORY",
    "queue": "VERITRAIN_CELERY_QUEUE",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir)")
    parser.add_argument("--broker-url", help="Celery broker (default: filesystem:// in the data dir)")
    parser.add_argument(
        "--result-backend-url", help="Celery result backend (default: file:// in the data dir)"
    )
    parser.add_argument("--data-dir", help="folder for the embedded database, broker and results")
    parser.add_argument("--chain-factory", help="module:callable building the chain port from the settings")
    parser.add_argument("--queue", help="Celery queue name (default veritrain-market)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pool", default="solo", choices=["solo", "prefork", "threads"])
    parser.add_argument("--no-beat", action="store_true", help="do not run the periodic market tick here")
    parser.add_argument("--loglevel", default="INFO")


def run(args: argparse.Namespace) -> int:
    for attribute, variable in OVERRIDES.items():
        value = getattr(args, attribute, None)
        if value:
            os.environ[variable] = str(value)
    from veritrain.settings import load_settings

    load_settings().ensure_dirs()
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
