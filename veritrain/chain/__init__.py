"""The settlement-plane client: backends, typed contract calls, EIP-712 signing, typed revert errors.

Imports are lazy (PEP 562) so `import veritrain.chain.smoke` for the CLI stays cheap; use
`from veritrain.chain import ChainClient` etc. as usual.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChainClient": "veritrain.chain.client",
    "Signed": "veritrain.chain.client",
    "SignedCommit": "veritrain.chain.client",
    "Reveal": "veritrain.chain.client",
    "Outcome": "veritrain.chain.client",
    "UnitState": "veritrain.chain.client",
    "Receipt": "veritrain.chain.tx",
    "Event": "veritrain.chain.tx",
    "Deployment": "veritrain.chain.deployment",
    "MarketParams": "veritrain.chain.deployment",
    "Backend": "veritrain.chain.backends",
    "InProcessBackend": "veritrain.chain.backends",
    "RpcBackend": "veritrain.chain.backends",
    "HardhatNode": "veritrain.chain.backends",
    "open_backend": "veritrain.chain.backends",
    "dev_accounts": "veritrain.chain.backends",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'veritrain.chain' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
