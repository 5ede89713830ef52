"""`veritrain market serve`: run the market API (FastAPI under uvicorn) on embedded defaults or given URLs."""

from __future__ import annotations

import argparse

from market.worker import add_operator_arguments, apply_overrides


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default from settings: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default from settings: 8700)")
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data dir)")
    parser.add_argument("--broker-url", help="Celery broker the API sends tasks to")
    parser.add_argument("--data-dir", help="folder for the embedded database and broker")
    parser.add_argument("--chain-factory", help="module:callable building the chain port from the settings")
    add_operator_arguments(parser)
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    apply_overrides(args)
    import uvicorn

    from market.api import create_app
    from market.runtime import build_service
    from market.tasks import wire_triggers
    from veritrain.settings import load_settings

    settings = load_settings()
    app = create_app(wire_triggers(build_service(settings)))
    uvicorn.run(
        app,
        host=args.host or settings.market_host,
        port=args.port or settings.market_port,
        log_level=args.log_level,
    )
    return 0
