"""Settings shared by every role (market, worker, agents, demo): one place for URLs and folders.

Embedded defaults need no service: a SQLite file and a `filesystem://` Celery broker under the data
dir, and a local JSON-RPC node. Each value can be overridden by an environment variable with the
prefix ``VERITRAIN_`` (for example ``VERITRAIN_DATABASE_URL=postgresql+psycopg://...``), so scaling
out is a URL change, not a code change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

FILESYSTEM_BROKER_URL = "filesystem://"


class Settings(BaseSettings):
    """Resolved configuration; empty URL fields are derived from ``data_dir``."""

    model_config = SettingsConfigDict(env_prefix="VERITRAIN_", frozen=True, extra="ignore")

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
    operator_key: SecretStr = SecretStr("")
    market_url: str = "http://127.0.0.1:8700"
    market_host: str = "127.0.0.1"
    market_port: int = 8700
    celery_queue: str = "veritrain-market"
    tick_s: float = 2.0
    heartbeat_timeout_s: int = 30
    accept_timeout_s: int = 60
    message_max_skew_s: int = 300

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
    """Settings from the environment, with explicit overrides (for CLIs and tests) taking precedence."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
