"""`veritrain config show`: the settings this host's processes would run with, secrets redacted.

What it prints is exactly what `load_settings()` resolves (flags aside): the environment over the TOML file
named by `--config`/`VERITRAIN_CONFIG` over the defaults, so an operator can check a deployment's
configuration before starting anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def configure_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run_show(args: argparse.Namespace) -> int:
    from veritrain.errors import ConfigError
    from veritrain.settings import CONFIG_ENV, load_settings, redacted

    try:
        values = redacted(load_settings())
    except ConfigError as err:
        print(f"veritrain config show: {err}", file=sys.stderr)
        return 2
    source = os.environ.get(CONFIG_ENV) or None
    if args.json:
        print(json.dumps({"config_file": source, "settings": values}, sort_keys=True))
        return 0
    print(f"# configuration file: {source or 'none (environment and defaults)'}")
    width = max(len(name) for name in values)
    for name, value in values.items():
        print(f"{name:<{width}} = {json.dumps(value)}")
    return 0
