"""`veritrain keys new|import|list|address`: encrypted keystores for every role (veritrain.keys).

The keystore folder is `<data dir>/keystore` (`--dir` to use another); a key is named by `--name` or its
address. The passphrase comes from the variable named by `--password-env` (default
VERITRAIN_KEYSTORE_PASSWORD) or a prompt; a new or imported key asks for it twice.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable
from pathlib import Path

from veritrain.errors import VeritrainError


def _folder_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=None, help="keystore folder (default: <data dir>/keystore)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _secret_arguments(parser: argparse.ArgumentParser) -> None:
    _folder_arguments(parser)
    parser.add_argument("--name", default=None, help="file name in the folder (default: the address)")
    parser.add_argument(
        "--password-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the passphrase (default: $VERITRAIN_KEYSTORE_PASSWORD_ENV "
        "or VERITRAIN_KEYSTORE_PASSWORD); a prompt when it is unset",
    )
    parser.add_argument(
        "--light-kdf",
        action="store_true",
        help="cheap scrypt (n=16384): for test and public development keys only",
    )


def _folder(args: argparse.Namespace) -> Path:
    from veritrain.keys import keystore_dir
    from veritrain.settings import load_settings

    return args.dir if args.dir is not None else keystore_dir(load_settings().data_dir)


def _password_env(args: argparse.Namespace) -> str:
    from veritrain.settings import load_settings

    return str(args.password_env or load_settings().keystore_password_env)


def _print_entry(args: argparse.Namespace, name: str, path: Path, address: str) -> None:
    if args.json:
        print(json.dumps({"name": name, "path": str(path), "address": address}))
    else:
        print(f"{address}  {path}")


def _guarded(command: str, run: Callable[[], None]) -> int:
    """Run a keys command; a typed error is one line on stderr and exit code 2."""
    try:
        run()
        return 0
    except VeritrainError as err:
        print(f"veritrain keys {command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def configure_new(parser: argparse.ArgumentParser) -> None:
    _secret_arguments(parser)


def run_new(args: argparse.Namespace) -> int:
    from veritrain.keys import new_key, passphrase_from

    def go() -> None:
        passphrase = passphrase_from(_password_env(args), prompt="New keystore passphrase: ", confirm=True)
        entry = new_key(_folder(args), args.name, passphrase, light=args.light_kdf)
        _print_entry(args, entry.name, entry.path, entry.address)

    return _guarded("new", go)


def configure_import(parser: argparse.ArgumentParser) -> None:
    _secret_arguments(parser)
    parser.add_argument(
        "--key-file",
        type=Path,
        default=None,
        help="plain file holding the hex private key (default: asked for at a prompt)",
    )


def run_import(args: argparse.Namespace) -> int:
    from veritrain.errors import KeystoreError
    from veritrain.keys import import_key, passphrase_from, read_private_key_file

    def go() -> None:
        if args.key_file is not None:
            key = read_private_key_file(args.key_file)
        elif sys.stdin.isatty():
            key = getpass.getpass("Private key (hex): ").strip()
        else:
            raise KeystoreError("give --key-file FILE, or run in a terminal to paste the key")
        passphrase = passphrase_from(_password_env(args), prompt="New keystore passphrase: ", confirm=True)
        entry = import_key(_folder(args), args.name, key, passphrase, light=args.light_kdf)
        _print_entry(args, entry.name, entry.path, entry.address)
        if args.key_file is not None and not args.json:
            print(f"the key is encrypted now; delete the plain file {args.key_file} once you have a backup")

    return _guarded("import", go)


def configure_list(parser: argparse.ArgumentParser) -> None:
    _folder_arguments(parser)


def run_list(args: argparse.Namespace) -> int:
    from veritrain.keys import list_keys

    def go() -> None:
        entries = list_keys(_folder(args))
        if args.json:
            print(json.dumps([{"name": e.name, "path": str(e.path), "address": e.address} for e in entries]))
            return
        if not entries:
            print(f"no keystores in {_folder(args)} (create one with `veritrain keys new`)")
        for entry in entries:
            print(f"{entry.address}  {entry.name}  {entry.path}")

    return _guarded("list", go)


def configure_address(parser: argparse.ArgumentParser) -> None:
    _folder_arguments(parser)
    parser.add_argument("key", help="keystore file, or the name of a key in the folder")


def run_address(args: argparse.Namespace) -> int:
    from veritrain.keys import keystore_address, resolve_keystore

    def go() -> None:
        path = resolve_keystore(args.key, _folder(args))
        address = keystore_address(path)
        if args.json:
            print(json.dumps({"name": path.stem, "path": str(path), "address": address}))
        else:
            print(address)

    return _guarded("address", go)
