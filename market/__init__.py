"""The market (control plane): matching, order/round/unit state, settlement outbox, API and Celery tasks.

Layout: ``domain/`` (pure core, no IO) · ``store`` (SQLModel repository) · ``ports`` (chain and recipe
interfaces) · ``service`` (every operation) · ``api`` / ``tasks`` / ``serve`` / ``worker`` / ``bench``
(thin edges) · ``client`` (HTTP client for agents) · ``chain_adapter`` (port over veritrain.chain).
"""
