"""One configuration for every role: TOML file < environment < flags; `veritrain config show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli import main
from veritrain.errors import ConfigError
from veritrain.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, and restored after the test even when `veritrain --config` exported VERITRAIN_CONFIG."""
    for name in ("VERITRAIN_CONFIG", "VERITRAIN_DATA_DIR", "VERITRAIN_MARKET_PORT", "VERITRAIN_OPERATOR_KEY"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


PLANT = "0x" + "ab" * 20  # a plant agent's address


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path / "v.toml", f'data_dir = "{tmp_path}/data"\nmarket_port = 9000\nmetrics_port = 9101\n'
    )
    monkeypatch.setenv("VERITRAIN_CONFIG", str(config))
    settings = load_settings()
    assert settings.data_dir == tmp_path / "data" and settings.market_port == 9000
    assert settings.database_url == f"sqlite:///{tmp_path}/data/market.sqlite3"  # derived from the file's dir
    monkeypatch.setenv("VERITRAIN_MARKET_PORT", "9001")
    assert load_settings().market_port == 9001
    assert load_settings(market_port=9002).market_port == 9002
    assert load_settings().metrics_port == 9101


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('data_dirr = "x"\n', "unknown setting"),
        ("market_port = \n", "not valid TOML"),
        ('market_port = "eighty"\n', "market_port"),
        (
            f'canary_rate_ppm = 600000\nplant_rate_ppm = 500000\nplant_agents = "{PLANT}"\n',
            "one roll draws both",
        ),
    ],
)
def test_bad_configuration_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.setenv("VERITRAIN_CONFIG", str(write(tmp_path / "v.toml", text)))
    with pytest.raises(ConfigError, match=message):
        load_settings()


def test_the_plant_rate_counts_only_with_plant_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default plant rate beside a canary rate of 100 % is fine while no plant agent can exist (the
    canary e2e test's market failed to start on that before). With a canary account plants can be enrolled
    at run time, so the plant rate counts: the sum is refused by name, and a plant rate of 0 makes room."""
    monkeypatch.setenv("VERITRAIN_CONFIG", str(write(tmp_path / "v.toml", "canary_rate_ppm = 1000000\n")))
    assert load_settings().canary_rate_ppm == 1_000_000
    canary = f'canary_rate_ppm = 1000000\ncanary_key = "0x{"11" * 32}"\n'
    monkeypatch.setenv("VERITRAIN_CONFIG", str(write(tmp_path / "c.toml", canary)))
    with pytest.raises(ConfigError, match="one roll draws both"):
        load_settings()
    monkeypatch.setenv("VERITRAIN_CONFIG", str(write(tmp_path / "p.toml", canary + "plant_rate_ppm = 0\n")))
    assert load_settings().plant_rate_ppm == 0


def test_missing_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERITRAIN_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()


def test_config_show_redacts_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(
        tmp_path / "v.toml",
        'database_url = "postgresql+psycopg://market:hunter2@db:5432/veritrain"\nmarket_port = 9000\n',
    )
    monkeypatch.setenv("VERITRAIN_OPERATOR_KEY", "0x" + "ab" * 32)
    assert main(["--config", str(config), "config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["config_file"] == str(config.resolve())
    assert shown["settings"]["market_port"] == 9000
    assert shown["settings"]["operator_key"] == "**********"
    assert shown["settings"]["database_url"] == "postgresql+psycopg://market:**********@db:5432/veritrain"
    assert main(["config", "show"]) == 0
    text = capsys.readouterr().out
    assert "hunter2" not in text and "abab" not in text and "market_port" in text


def test_a_refused_command_is_one_line_and_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERITRAIN_KEYSTORE", "")
    monkeypatch.delenv("VERITRAIN_KEYSTORE")
    assert main(["node", "run", "--data-dir", str(tmp_path)]) == 2
    assert "AgentError: no key: give --keystore FILE" in capsys.readouterr().err
    config = write(tmp_path / "v.toml", "market_port = [1]\n")
    assert main(["--config", str(config), "verifier", "run", "--keystore", "k.json"]) == 2
    assert "ConfigError: invalid configuration: market_port" in capsys.readouterr().err
