"""Keystores: `veritrain keys …` and the loader every role uses (veritrain.keys)."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest
from eth_account import Account

from apps.cli import main
from veritrain import keys
from veritrain.errors import KeystoreError, WrongPassphrase

PASSWORD_ENV = "VERITRAIN_KEYSTORE_PASSWORD"


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no unlocked key and a known passphrase in the environment."""
    monkeypatch.setattr(keys, "_unlocked", {})
    monkeypatch.setenv(PASSWORD_ENV, "correct horse")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_new_list_address_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ks"
    argv = ("keys", "new", "--dir", str(folder), "--name", "op", "--light-kdf", "--json")
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    created = json.loads(out)
    path = Path(created["path"])
    assert path == folder / "op.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = json.loads(path.read_text())
    assert raw["version"] == 3 and raw["crypto"]["kdf"] == "scrypt"
    # a standard keystore: eth-account alone decrypts it to the announced address
    assert Account.from_key(Account.decrypt(raw, "correct horse")).address == created["address"]

    code, out, _ = run_cli(capsys, "keys", "list", "--dir", str(folder), "--json")
    assert code == 0 and json.loads(out) == [created]
    code, out, _ = run_cli(capsys, "keys", "address", "op", "--dir", str(folder))
    assert code == 0 and out.strip() == created["address"]
    assert keys.load_signer(path).address == created["address"]


def test_import_encrypts_a_plain_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    account = Account.create()
    plain = tmp_path / "old.key"
    plain.write_text("0x" + bytes(account.key).hex() + "\n")
    folder = tmp_path / "ks"
    code, out, _ = run_cli(
        capsys, "keys", "import", "--key-file", str(plain), "--dir", str(folder), "--light-kdf", "--json"
    )
    assert code == 0
    entry = json.loads(out)
    assert entry["address"] == account.address and entry["name"] == account.address
    assert keys.load_signer(Path(entry["path"])).key == account.key


def test_plain_key_file_still_loads_but_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    account = Account.create()
    plain = tmp_path / "agent.key"
    plain.write_text(bytes(account.key).hex())
    with caplog.at_level(logging.WARNING, logger="veritrain.keys"):
        assert keys.load_signer(plain).address == account.address
    assert "plain private key file" in caplog.text


def test_wrong_passphrase_is_refused_and_cache_stays_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = keys.new_key(tmp_path, "a", "correct horse", light=True)
    monkeypatch.setenv(PASSWORD_ENV, "battery staple")
    with pytest.raises(WrongPassphrase, match="wrong passphrase"):
        keys.load_signer(entry.path)
    assert keys._unlocked == {}
    monkeypatch.setenv(PASSWORD_ENV, "correct horse")
    assert keys.load_signer(entry.path).address == entry.address


def test_unlocked_once_then_reused_without_passphrase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keys.new_key(tmp_path, "a", "correct horse", light=True)
    first = keys.load_signer(entry.path)
    monkeypatch.delenv(PASSWORD_ENV)
    assert keys.load_signer(entry.path, prompt=False) is first


def test_no_passphrase_without_a_terminal_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keys.new_key(tmp_path, "a", "correct horse", light=True)
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(KeystoreError, match=f"set {PASSWORD_ENV}"):
        keys.load_signer(entry.path)
    monkeypatch.setenv("MY_PASS", "correct horse")
    assert keys.load_signer(entry.path, password_env="MY_PASS").address == entry.address


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "neither a hex private key nor keystore JSON"),
        ('{"address": "00"}', "not a keystore"),
        ("0x1234", "neither a hex private key"),
    ],
)
def test_unusable_key_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "k.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KeystoreError, match=message):
        keys.load_signer(path)


def test_existing_keystore_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = keys.new_key(tmp_path, "op", "correct horse", light=True)
    before = entry.path.read_bytes()
    code, _, err = run_cli(capsys, "keys", "new", "--dir", str(tmp_path), "--name", "op", "--light-kdf")
    assert code == 2 and "already exists" in err
    assert entry.path.read_bytes() == before
    code, _, err = run_cli(capsys, "keys", "address", "nobody", "--dir", str(tmp_path))
    assert code == 2 and "no keystore 'nobody'" in err


def test_agents_take_keystore_and_the_old_key_file_flag() -> None:
    import argparse

    from veritrain.agentkit import add_common_agent_arguments

    parser = argparse.ArgumentParser()
    add_common_agent_arguments(parser)
    assert parser.parse_args(["--keystore", "a.json"]).keystore == Path("a.json")
    assert parser.parse_args(["--key-file", "b.key"]).keystore == Path("b.key")
