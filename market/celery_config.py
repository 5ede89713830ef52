"""The one Celery configuration, imported by the API side (which sends tasks) and every worker.

Delivery is at-least-once (acks_late; SECURITY.md §4.1), so every task is short and idempotent: it
re-reads state from the store and the settlement outbox decides whether anything is left to do. A
worker killed mid-task does not requeue forever (``task_reject_on_worker_lost`` stays off); the
periodic tick re-dispatches whatever is still pending; a failed outbox entry waits out its own backoff.
"""

from __future__ import annotations

from typing import Any

from market.broker import atomic_broker_url
from veritrain.settings import Settings

TASK_TIME_LIMIT_S = 60
REDIS_VISIBILITY_TIMEOUT_S = 300  # far above any task (they take milliseconds), far below the 1 h default


def celery_settings(settings: Settings) -> dict[str, Any]:
    transport_options = settings.broker_transport_options()
    if settings.broker_url.startswith(("redis://", "rediss://")):
        transport_options = {"visibility_timeout": REDIS_VISIBILITY_TIMEOUT_S}
    return {
        "broker_url": atomic_broker_url(settings.broker_url),
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        "result_backend": settings.result_backend_url or None,
        "result_expires": 3600,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": False,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": TASK_TIME_LIMIT_S,
        "task_soft_time_limit": TASK_TIME_LIMIT_S - 10,
        "task_default_queue": settings.celery_queue,
        "worker_hijack_root_logger": False,
        # Nothing here uses remote control (inspect, broadcast) or the worker-to-worker gossip it rides
        # on; off, the filesystem transport makes no pidbox fanout exchange (its "control/" folder in cwd).
        "worker_enable_remote_control": False,
        "worker_send_task_events": False,
        "beat_schedule": {
            "market-tick": {"task": "market.tick", "schedule": settings.tick_s},
        },
    }
