"""The embedded broker's sends are atomic: a consumer never reads a message file before it is whole."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.transport import filesystem

from market import broker
from market.celery_config import celery_settings
from veritrain.settings import load_settings


def test_a_consumer_polling_during_a_send_sees_no_partial_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's own _put creates `<name>.msg` and only then serialises and writes into it; a worker that
    polled in between read an empty file and died with JSONDecodeError."""
    queue = tmp_path / "queue"
    queue.mkdir()
    options = {"data_folder_in": str(queue), "data_folder_out": str(queue), "control_folder": str(tmp_path)}
    with Connection(broker.atomic_broker_url("filesystem://"), transport_options=options) as connection:
        channel = connection.default_channel
        assert isinstance(channel, broker.AtomicFilesystemChannel)
        seen_mid_send: list[Any] = []
        real_dumps = broker.dumps

        def dumps_while_polling(payload: Any) -> str:
            with contextlib.suppress(filesystem.Empty):
                seen_mid_send.append(channel._get("jobs"))  # what a concurrent worker would read now
            return str(real_dumps(payload))

        monkeypatch.setattr(broker, "dumps", dumps_while_polling)
        monkeypatch.setattr(filesystem, "dumps", dumps_while_polling)  # kombu's own _put, for contrast
        channel._put("jobs", {"body": "whole"})
        assert seen_mid_send == []
        assert channel._get("jobs") == {"body": "whole"}
        assert sorted(p.name for p in queue.iterdir()) == []  # no temp file left behind


def test_the_embedded_broker_uses_the_atomic_transport_and_no_remote_control(tmp_path: Path) -> None:
    config = celery_settings(load_settings(data_dir=tmp_path))
    assert config["broker_url"].startswith(broker.ATOMIC_FILESYSTEM_SCHEME + "://")
    assert config["worker_enable_remote_control"] is False
    redis = celery_settings(load_settings(data_dir=tmp_path, broker_url="redis://127.0.0.1:6379/0"))
    assert redis["broker_url"] == "redis://127.0.0.1:6379/0"
