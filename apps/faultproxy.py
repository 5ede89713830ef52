"""A user-space TCP proxy whose links can be slowed, made lossy or partitioned: network faults without root.

Why: the kernel here has no `netem` (TOOLCHAIN.md), and the chaos bench must fault an agent's network
without network namespaces. Each agent reaches the market API and the chain RPC through its own *link*:
one loopback listener per upstream, all switched together between
- pass: bytes go through unchanged;
- slow: every chunk is held `delay_s` in each direction (order kept, throughput not capped), and each
  chunk is lost with probability `loss`, which resets the connection both ways (a request may reach the
  upstream while its reply is lost: the client sees a reset and must retry idempotently);
- partition: every open connection is reset and every new one is reset as soon as it is accepted.
One event loop in one daemon thread serves every link; `set_mode` is safe from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from veritrain.errors import VeritrainError

CHUNK_BYTES = 65536
START_TIMEOUT_S = 10.0
T = TypeVar("T")


class FaultProxyError(VeritrainError):
    """Bad use of the fault proxy (unknown link, bad mode, not started)."""


@dataclass(frozen=True)
class LinkMode:
    """What a link does to its traffic now; see the module docstring."""

    name: str = "pass"  # pass | slow | partition
    delay_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("pass", "slow", "partition"):
            raise FaultProxyError(f"unknown link mode {self.name!r}")
        if self.delay_s < 0 or not 0.0 <= self.loss <= 1.0:
            raise FaultProxyError(f"bad link mode {self}: delay >= 0 and 0 <= loss <= 1")


PASS = LinkMode()


@dataclass
class _Link:
    mode: LinkMode
    rng: random.Random
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    servers: list[asyncio.Server] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped link or a crashed peer looks to the other end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """The links of one harness, served by one background event loop (start / stop, or a context)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._links: dict[str, _Link] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise FaultProxyError("the fault proxy's event loop did not start")

    def stop(self) -> None:
        """Close every listener and connection, then end the loop thread."""
        if self._loop is None:
            return
        self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)
        self._loop = None

    def open(self, link: str, upstreams: Sequence[tuple[str, int]], host: str = "127.0.0.1") -> list[int]:
        """Open link `link` (passing) with one listener per upstream; returns their ports, in order."""
        if link in self._links:
            raise FaultProxyError(f"link {link!r} is open already")
        rng = random.Random(f"{self.seed}:{link}")  # loss draws: reproducible per link, given the chunks
        self._links[link] = _Link(PASS, rng)
        return [self._call(self._listen(link, host, upstream)) for upstream in upstreams]

    def mode(self, link: str) -> LinkMode:
        return self._link(link).mode

    def set_mode(self, link: str, mode: LinkMode) -> None:
        """Switch a link; a partition resets its open connections at once."""
        self._call(self._set_mode(self._link(link), mode))

    def _link(self, name: str) -> _Link:
        if name not in self._links:
            raise FaultProxyError(f"no link {name!r}; open it first")
        return self._links[name]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            raise FaultProxyError("the fault proxy is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(START_TIMEOUT_S)

    # --- on the loop ---------------------------------------------------------------------------------

    async def _listen(self, name: str, host: str, upstream: tuple[str, int]) -> int:
        link = self._links[name]

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(link, upstream, reader, writer)

        server = await asyncio.start_server(handle, host, 0)
        link.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _set_mode(self, link: _Link, mode: LinkMode) -> None:
        link.mode = mode
        if mode.name == "partition":
            for writer in list(link.writers):
                _reset(writer)
            link.writers.clear()

    async def _close_all(self) -> None:
        for link in self._links.values():
            for server in link.servers:
                server.close()
            for writer in list(link.writers):
                _reset(writer)
            link.writers.clear()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(
        self,
        link: _Link,
        upstream: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if link.mode.name == "partition":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:  # the upstream is down (a killed market): the client sees a reset
            _reset(writer)
            return
        pair = (writer, up_writer)
        link.writers.update(pair)
        try:
            await asyncio.gather(
                self._pump(link, reader, up_writer, pair), self._pump(link, up_reader, writer, pair)
            )
        finally:
            for end in pair:
                link.writers.discard(end)
                end.transport.abort()

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        """One direction: read chunks, stamp each with its due time, deliver them in order when due."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                mode = link.mode
                if chunk and mode.loss and link.rng.random() < mode.loss:
                    for end in pair:
                        _reset(end)
                    return
                queue.put_nowait((time.monotonic() + mode.delay_s, chunk))
                if not chunk:
                    break
            await sender
        except (ConnectionError, OSError):
            for end in pair:
                _reset(end)
        finally:
            sender.cancel()
