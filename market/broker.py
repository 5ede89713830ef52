"""The embedded broker: kombu's filesystem transport with atomic sends.

kombu 5.7's filesystem ``Channel._put`` creates ``<name>.msg`` and then writes it, while ``_get`` of
another process moves and reads any ``*.msg`` it lists; a consumer that lists the file between the two
reads an empty or partial message and the worker dies with a JSONDecodeError. Here the message is
written under a name ``_get`` ignores, flushed, and renamed into place (``os.replace`` is atomic within
one folder), so a consumer sees either no file or the whole message.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ATOMIC_FILESYSTEM_SCHEME = "veritrainfs"


class AtomicFilesystemChannel(filesystem.Channel):
    # kombu's own filesystem Channel renames the base class's `message` to `payload`; we keep its signature.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(filesystem.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"  # kombu's own naming
        final = os.path.join(self.data_folder_out, name)
        # "_<uuid>.tmp": partition('.')[2] is "tmp", never "<queue>.msg", so no consumer picks it up
        partial = os.path.join(self.data_folder_out, f"_{uuid.uuid4()}.tmp")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = AtomicFilesystemChannel
    driver_name = "veritrain-filesystem"


def register() -> None:
    """Make ``veritrainfs://`` resolve to the atomic transport (in every process that imports the config)."""
    TRANSPORT_ALIASES[ATOMIC_FILESYSTEM_SCHEME] = "market.broker:AtomicFilesystemTransport"


def atomic_broker_url(url: str) -> str:
    """``filesystem://...`` → ``veritrainfs://...``; other brokers unchanged."""
    if url.startswith("filesystem://"):
        register()
        return ATOMIC_FILESYSTEM_SCHEME + url.removeprefix("filesystem")
    return url
