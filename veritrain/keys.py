"""Keys of every role: standard encrypted JSON keystores (Web3 Secret Storage, eth-account), one folder.

Why keystores: an agent, the market operator or a buyer holds a key that moves tokens; a plain hex file
gives it to anyone who can read the disk or a backup. A keystore is encrypted with a passphrase (scrypt +
AES-128-CTR, the format geth and every wallet read), and the passphrase comes from a prompt or from an
environment variable the operator names, never from a command line where `ps` shows it.

A plain hex key file still loads (old set-ups, the public development accounts) but logs a warning.
Unlocked accounts are cached per file for the life of the process, so a service unlocks once at start
(where it may prompt) and its workers reuse the key without asking again.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritrain.errors import KeystoreError, WrongPassphrase

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

logger = logging.getLogger("veritrain.keys")

DEFAULT_PASSWORD_ENV = "VERITRAIN_KEYSTORE_PASSWORD"
# scrypt n of a "light" keystore (tests, the demo's public dev keys): ~20 ms instead of ~1 s to unlock.
LIGHT_SCRYPT_N = 2**14
KEYSTORE_SUFFIX = ".json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")

_unlocked: dict[Path, LocalAccount] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class KeystoreEntry:
    """A keystore file and the address it declares (readable without the passphrase)."""

    name: str
    path: Path
    address: str


def keystore_dir(data_dir: Path) -> Path:
    """The folder `veritrain keys` keeps keystores in: `<data dir>/keystore`."""
    return data_dir / "keystore"


def passphrase_from(
    env_name: str = DEFAULT_PASSWORD_ENV,
    *,
    prompt: str | None = "Keystore passphrase: ",
    confirm: bool = False,
    ask: Callable[[str], str] = getpass.getpass,
) -> str:
    """The passphrase from the environment variable `env_name`, else from a terminal prompt.

    `prompt=None` (services that run unattended after start) refuses to ask. An empty passphrase is
    refused: it would encrypt the key with nothing."""
    value = os.environ.get(env_name)
    if value is None:
        if prompt is None or not sys.stdin.isatty():
            raise KeystoreError(f"no passphrase: set {env_name} or run the command in a terminal to be asked")
        value = ask(prompt)
        if confirm and ask("Repeat the passphrase: ") != value:
            raise KeystoreError("the two passphrases differ")
    if not value:
        raise KeystoreError(f"empty passphrase (from {env_name} or the prompt)")
    return value


def encrypt_key(private_key: bytes | str, passphrase: str, *, light: bool = False) -> dict[str, Any]:
    """The keystore JSON object of a key (scrypt; `light` lowers its cost for test and dev keys only)."""
    from eth_account import Account
    from eth_typing import HexStr

    key = private_key if isinstance(private_key, bytes) else HexStr(private_key)
    return dict(Account.encrypt(key, passphrase, iterations=LIGHT_SCRYPT_N if light else None))


def write_keystore(folder: Path, name: str, keystore: dict[str, Any]) -> Path:
    """Save a keystore as `<folder>/<name>.json`, mode 0600, refusing to overwrite an existing one."""
    if not _NAME.match(name):
        raise KeystoreError(f"key name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{name}{KEYSTORE_SUFFIX}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeystoreError(f"{path} already exists; choose another --name") from None
    with os.fdopen(fd, "w") as handle:
        json.dump(keystore, handle)
        handle.write("\n")
    return path


def new_key(folder: Path, name: str | None, passphrase: str, *, light: bool = False) -> KeystoreEntry:
    """Generate a fresh key and store it encrypted; its name defaults to its address."""
    from eth_account import Account

    account = Account.create()
    return import_key(folder, name, bytes(account.key), passphrase, light=light)


def import_key(
    folder: Path, name: str | None, private_key: bytes | str, passphrase: str, *, light: bool = False
) -> KeystoreEntry:
    """Store an existing private key (bytes or hex) encrypted in the keystore folder."""
    from eth_account import Account

    try:
        address = str(Account.from_key(private_key).address)
    except (ValueError, TypeError) as err:
        raise KeystoreError(f"not a private key: {err}") from None
    path = write_keystore(folder, name or address, encrypt_key(private_key, passphrase, light=light))
    return KeystoreEntry(path.stem, path, address)


def read_private_key_file(path: Path) -> str:
    """The hex private key held in a plain key file (the format `keys import --key-file` reads)."""
    text = _read_text(path).strip()
    if not _HEX_KEY.match(text):
        raise KeystoreError(f"{path} does not hold a 32-byte hex private key")
    return text


def list_keys(folder: Path) -> list[KeystoreEntry]:
    """The keystores in `folder`, by name; unreadable files are skipped with a warning."""
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob(f"*{KEYSTORE_SUFFIX}")):
        try:
            entries.append(KeystoreEntry(path.stem, path, keystore_address(path)))
        except KeystoreError as err:
            logger.warning("skipping %s: %s", path, err)
    return entries


def resolve_keystore(name_or_path: str | Path, folder: Path) -> Path:
    """A keystore given by path, or by name in the keystore folder (`operator` → folder/operator.json)."""
    candidate = Path(name_or_path)
    if candidate.exists():
        return candidate
    named = folder / f"{name_or_path}{KEYSTORE_SUFFIX}"
    if named.exists():
        return named
    raise KeystoreError(f"no keystore {name_or_path!r} (neither a file nor a key in {folder})")


def keystore_address(path: Path) -> str:
    """The checksummed address a keystore declares (no passphrase needed), or of a plain key file."""
    from eth_account import Account
    from eth_utils import to_checksum_address

    raw = _parse(path)
    if isinstance(raw, str):
        return str(Account.from_key(raw).address)
    address = raw.get("address")
    if not isinstance(address, str):
        raise KeystoreError(f"{path} is a keystore without an address field")
    try:
        return str(to_checksum_address(address if address.startswith("0x") else "0x" + address))
    except ValueError as err:
        raise KeystoreError(f"{path} declares a malformed address {address!r}") from err


def load_signer(path: Path, *, password_env: str = DEFAULT_PASSWORD_ENV, prompt: bool = True) -> LocalAccount:
    """The account of a keystore (decrypted with the passphrase from `password_env` or a prompt) or of a
    plain hex key file (with a warning). Cached per file: a second call neither asks nor decrypts again."""
    from eth_account import Account

    resolved = path.resolve()
    with _lock:
        cached = _unlocked.get(resolved)
    if cached is not None:
        return cached
    raw = _parse(path)
    if isinstance(raw, str):
        logger.warning(
            "%s is a plain private key file: anyone who reads it holds the key; "
            "encrypt it with `veritrain keys import --key-file %s`",
            path,
            path,
        )
        account = Account.from_key(raw)
    else:
        passphrase = passphrase_from(password_env, prompt=f"Passphrase of {path}: " if prompt else None)
        try:
            account = Account.from_key(Account.decrypt(raw, passphrase))
        except ValueError as err:
            if "MAC mismatch" in str(err):
                raise WrongPassphrase(f"wrong passphrase for {path}") from None
            raise KeystoreError(f"{path} is not a keystore eth-account can read: {err}") from None
        expected = raw.get("address")
        if isinstance(expected, str) and expected.lower().removeprefix("0x") != account.address[2:].lower():
            raise KeystoreError(f"{path} declares address {expected} but holds the key of {account.address}")
    with _lock:
        _unlocked[resolved] = account
    return account


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise KeystoreError(f"key file {path} does not exist") from None
    except IsADirectoryError:
        raise KeystoreError(f"{path} is a folder, not a key file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise KeystoreError(f"cannot read {path}: {err}") from None


def _parse(path: Path) -> dict[str, Any] | str:
    """A keystore's JSON object, or the hex key of a plain key file."""
    text = _read_text(path).strip()
    if _HEX_KEY.match(text):
        return text
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise KeystoreError(f"{path} is neither a hex private key nor keystore JSON: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("crypto", raw.get("Crypto")), dict):
        raise KeystoreError(f"{path} is JSON but not a keystore (no 'crypto' object)")
    return raw
