"""Settings shared by every role (market, worker, agents, buyer, demo): one place for URLs and folders.

Embedded defaults need no service: a SQLite file and a `filesystem://` Celery broker under the data
dir, and a local JSON-RPC node. Each value comes, highest precedence first, from a command-line flag,
an environment variable with the prefix ``VERITRAIN_`` (for example
``VERITRAIN_DATABASE_URL=postgresql+psycopg://...``), the TOML file named by ``VERITRAIN_CONFIG``
(``veritrain --config FILE``; top-level keys are the field names below), then the default. So scaling out
is a URL change, not a code change, and one file configures every process of a host.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from veritrain.errors import ConfigError

FILESYSTEM_BROKER_URL = "filesystem://"
CONFIG_ENV = "VERITRAIN_CONFIG"
REDACTED = "**********"


class TomlFileSource(PydanticBaseSettingsSource):
    """The TOML file named by ``VERITRAIN_CONFIG``; an unknown key is an error (a typo must not pass)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self.path = path
        try:
            self.values = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist ({CONFIG_ENV})") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"configuration file {path} is not valid TOML: {err}") from None
        unknown = sorted(set(self.values) - set(settings_cls.model_fields))
        if unknown:
            raise ConfigError(f"{path}: unknown setting(s) {unknown}; `veritrain config show` lists them")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


class Settings(BaseSettings):
    """Resolved configuration; empty URL fields are derived from ``data_dir``."""

    model_config = SettingsConfigDict(env_prefix="VERITRAIN_", frozen=True, extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init arguments) over the environment over the TOML file of ``VERITRAIN_CONFIG``."""
        config = os.environ.get(CONFIG_ENV)
        if not config:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlFileSource(settings_cls, Path(config)))

    data_dir: Path = Path(".veritrain")
    database_url: str = ""
    broker_url: str = ""
    result_backend_url: str = ""
    chain_rpc_url: str = "http://127.0.0.1:8545"
    chain_id: int = 31337
    # "module:callable" building the market's chain port from these settings (empty: veritrain.chain).
    chain_factory: str = ""
    deployments_file: Path | None = None
    # The market's operator/relayer key (hex). It proposes assignments and relays signed forms.
    # Prefer `keystore`: an encrypted file instead of a key in the environment.
    operator_key: SecretStr = SecretStr("")
    # This process's key (market operator, agent or buyer): an encrypted keystore (veritrain.keys) or,
    # with a warning, a plain hex key file; its passphrase comes from the variable named here or a prompt.
    keystore: Path | None = None
    keystore_password_env: str = "VERITRAIN_KEYSTORE_PASSWORD"
    # Prometheus /metrics of an agent or a Celery worker (the market API serves it on its own port); 0: off.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    # An agent's libp2p listen address (0: any free port).
    p2p_host: str = "127.0.0.1"
    p2p_port: int = 0
    market_url: str = "http://127.0.0.1:8700"
    market_host: str = "127.0.0.1"
    market_port: int = 8700
    celery_queue: str = "veritrain-market"
    tick_s: float = 2.0
    heartbeat_timeout_s: int = 30
    # blocks an event must be buried under before the market applies it (reorg safety; 0 on a dev chain)
    chain_confirmations: int = 0
    accept_timeout_s: int = 60
    message_max_skew_s: int = 300
    # how long a round waits for an agent other than its start state's producers to hold that state
    custody_wait_s: int = 30
    # canary units (market/canary.py): the key of the operator-funded account that buys them (none: no
    # canaries) and the share of verified round-0 units it replays, in parts per million
    canary_key: SecretStr = SecretStr("")
    canary_rate_ppm: int = Field(default=50_000, ge=0, le=1_000_000)
    # planted cheats (verifier canaries, market/canary.py): the operator's own `veritrain node run --plant`
    # agents (comma-separated addresses) besides the keys the canary account enrolls at run time (a plant
    # agent run with --plant-keys), and the share of verified round-0 units replayed as a planted
    # cheat for the verifiers, in parts per million (with the canary rate at most 10^6)
    plant_agents: str = ""
    plant_rate_ppm: int = Field(default=10_000, ge=0, le=1_000_000)

    @model_validator(mode="before")
    @classmethod
    def _derive_defaults(cls, values: Any) -> Any:
        """Fill URLs left empty from the data dir, so one ``data_dir`` moves the whole embedded setup."""
        if not isinstance(values, dict):
            return values
        data_dir = Path(values.get("data_dir") or ".veritrain")
        if not values.get("database_url"):
            values["database_url"] = f"sqlite:///{(data_dir / 'market.sqlite3').as_posix()}"
        if not values.get("broker_url"):
            values["broker_url"] = FILESYSTEM_BROKER_URL
        if not values.get("result_backend_url"):
            values["result_backend_url"] = f"file://{(data_dir / 'results').resolve().as_posix()}"
        return values

    @model_validator(mode="after")
    def _one_roll_draws_canaries_and_plants(self) -> Settings:
        """Canaries and plants share one roll per verified unit (market/domain/canary.py); the plant rate
        counts only when the operator can run plant agents (named, or enrolled by the canary account)."""
        runs_plants = bool(self.plant_agents.strip() or self.canary_key.get_secret_value())
        if runs_plants and self.canary_rate_ppm + self.plant_rate_ppm > 1_000_000:
            raise ValueError("canary_rate_ppm + plant_rate_ppm exceed 1,000,000 (one roll draws both)")
        return self

    @property
    def broker_folder(self) -> Path:
        """Folder the `filesystem://` broker exchanges messages through (ignored for other brokers)."""
        return self.data_dir / "broker"

    @property
    def uses_filesystem_broker(self) -> bool:
        return self.broker_url.startswith(FILESYSTEM_BROKER_URL)

    def broker_transport_options(self) -> dict[str, Any]:
        """Kombu transport options; the filesystem transport needs its in/out/processed folders."""
        if not self.uses_filesystem_broker:
            return {}
        queue = self.broker_folder / "queue"
        processed = self.broker_folder / "processed"
        return {
            "data_folder_in": str(queue),
            "data_folder_out": str(queue),
            "processed_folder": str(processed),
            "control_folder": str(self.broker_folder / "control"),
            "store_processed": False,
            "polling_interval": 0.1,  # seconds between folder scans (kombu's default is 1 s)
        }

    def ensure_dirs(self) -> None:
        """Create the data dir (and the broker folders when the filesystem broker is used)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.uses_filesystem_broker:
            for key in ("data_folder_in", "processed_folder", "control_folder"):
                Path(self.broker_transport_options()[key]).mkdir(parents=True, exist_ok=True)
        if self.result_backend_url.startswith("file://"):
            Path(self.result_backend_url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and the config file, with explicit overrides (flags, tests) first.

    A value that does not validate is a :class:`ConfigError` naming the setting."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None


def redacted(settings: Settings) -> dict[str, Any]:
    """Every setting as JSON-able values, with secrets and passwords inside URLs replaced by asterisks."""
    values = settings.model_dump(mode="json")
    for name, value in values.items():
        if isinstance(getattr(settings, name), SecretStr):
            values[name] = REDACTED if value else ""
        elif isinstance(value, str) and "://" in value:
            values[name] = _redact_url(value)
    return values


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))
