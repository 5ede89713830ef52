"""Where a buyer fetches its order's results: the libp2p address of every provider that ran a replica.

Only addresses: which replicas were accepted, and the digests the fetched blobs must hash to, the buyer
reads from the chain, so a wrong answer here can delay a fetch but never hand over an unverified state.
"""

from __future__ import annotations

from market.context import row_id
from market.service import MarketService
from veritrain.messages import OrderPeers


def order_peers(service: MarketService, order_id: int) -> OrderPeers:
    """Provider address → announced libp2p address, for the providers of the order's replicas."""
    store = service.store
    with store.transaction() as session:
        order = store.get_order(session, order_id)  # NotFound (404) for an unknown order
        units = store.units_of_order(session, order_id)
        replicas = store.replicas_of_units(session, [row_id(unit) for unit in units])
        providers = sorted({r.provider for rows in replicas.values() for r in rows})
        peers = {}
        for provider in providers:
            agent = store.find_agent(session, provider)
            if agent is not None and agent.p2p_addr:
                peers[provider] = agent.p2p_addr
        return OrderPeers(order_id=order_id, chain_order_id=order.chain_order_id, peers=peers)
