"""Prometheus metrics of an agent (provider or verifier), served on its own small HTTP endpoint.

Why a registry per agent instead of prometheus-client's global one: tests and the benchmarks run several
agents in one process, and each must report only its own work. Why a separate port: an agent's only other
listener is libp2p, and a provider behind home NAT serves /metrics to its operator on the LAN, not to the
market. The market's own families are computed from its database (market/metrics.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger("veritrain.metrics")

# Unit wall times: a charlm-tiny unit takes seconds on a CPU, a real recipe hours on a GPU.
UNIT_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)


class _BytesServed(Collector):
    """`veritrain_blob_bytes_served_total`, read from the data plane's counters at scrape time."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "veritrain_blob_bytes_served",
            "Blob bytes this agent served to peers over libp2p",
            value=self._read(),
        )


class AgentMetrics:
    """The families every agent exports; a provider fills the training ones, a verifier the verdict ones
    (its replays count as training tokens too: re-execution is the verifier's compute)."""

    def __init__(self, bytes_served: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.heartbeats = Counter(
            "veritrain_agent_heartbeats",
            "Signed heartbeats sent to the market, by result",
            ["result"],
            registry=self.registry,
        )
        self.units = Counter(
            "veritrain_agent_units",
            "Units trained (provider) or verified (verifier), by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.unit_duration = Histogram(
            "veritrain_unit_duration_seconds",
            "Wall time of one unit's training or verification",
            buckets=UNIT_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "veritrain_training_tokens",
            "Tokens trained or re-executed (examples for a classifier)",
            registry=self.registry,
        )
        self.tokens_per_second = Gauge(
            "veritrain_training_tokens_per_second",
            "Throughput of the last unit trained or re-executed",
            registry=self.registry,
        )
        self.verdicts = Counter(
            "veritrain_agent_verdicts",
            "Per-replica outcomes this verifier signed",
            ["outcome"],
            registry=self.registry,
        )
        self.registry.register(_BytesServed(bytes_served))
        self._server: Any = None

    def record_unit(self, outcome: str, seconds: float, tokens: int) -> None:
        """One unit done: its outcome, wall time and the tokens it trained or re-executed."""
        self.units.labels(outcome).inc()
        self.unit_duration.observe(seconds)
        self.tokens.inc(tokens)
        if seconds > 0 and tokens > 0:
            self.tokens_per_second.set(tokens / seconds)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: any free port) in a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        bound = int(server.server_address[1])
        logger.info("metrics at http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
