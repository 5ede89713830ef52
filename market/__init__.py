"""The market (control plane): matching, order/round/unit state, settlement outbox, API and Celery tasks.

Layout: ``domain/`` (pure core, no IO) · ``store`` (SQLModel repository) · ``ports`` (chain and recipe
interfaces) · one module per lifecycle over the store (``registry``, ``orders``, ``matchmaker``,
``assignments``, ``verification``, ``outbox``, ``sync``; shared plumbing in ``context``), composed by
``service`` · ``api`` / ``tasks`` / ``serve`` / ``worker`` / ``bench`` (thin edges) · ``chain_adapter``
(port over veritrain.chain).
"""
