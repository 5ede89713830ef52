"""Store conformance: the same assertions on SQLite and on a fresh PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from market.store import (
    AgentRow,
    HeartbeatRow,
    MarketStore,
    OrderRow,
    OutboxRow,
    ReplicaRow,
    RoundRow,
    UnitRow,
)
from veritrain.errors import MarketError, NotFound


def seed_unit(store: MarketStore) -> int:
    with store.transaction() as session:
        order = OrderRow(
            chain_order_id=2**255 + 1,
            buyer="0x" + "b" * 40,
            spec_json="{}",
            spec_hash="0x00",
            recipe="digits-mlp",
            rounds_total=1,
            flops_per_step=10**30,
            min_memory_mb=1,
            price_per_replica=2**256 - 1,
            max_price_per_pflop=10**18,
            deadline=1,
            created_at=0,
        )
        session.add(order)
        session.flush()
        assert order.id is not None
        round_row = RoundRow(order_id=order.id, index=0)
        session.add(round_row)
        session.flush()
        assert round_row.id is not None
        unit = UnitRow(
            order_id=order.id,
            round_id=round_row.id,
            round_index=0,
            unit_key="0x" + "1" * 64,
            k=3,
            start_step=0,
            steps=10,
            chain_unit_id=2**200,
        )
        session.add(unit)
        session.flush()
        assert unit.id is not None
        return unit.id


def test_uint256_values_round_trip_exactly(store: MarketStore) -> None:
    unit_id = seed_unit(store)
    with store.transaction() as session:
        unit = store.get_unit(session, unit_id)
        order = store.get_order(session, unit.order_id)
        assert order.price_per_replica == 2**256 - 1 and order.chain_order_id == 2**255 + 1
        assert order.flops_per_step == 10**30
        assert store.unit_by_chain_id(session, 2**200) is not None
        assert store.order_by_chain_id(session, 2**255 + 1) is not None


def test_outbox_enqueue_is_idempotent_per_unit_and_action(store: MarketStore) -> None:
    unit_id = seed_unit(store)
    with store.transaction() as session:
        first = store.enqueue(session, unit_id, "finalize", {"unit_id": 1}, now=5)
        again = store.enqueue(session, unit_id, "finalize", {"unit_id": 1}, now=6)
        assert first.id == again.id
        store.enqueue(session, unit_id, "reveal:0xabc", {}, now=7)
    with store.transaction() as session:
        assert [e.action for e in store.outbox_in(session, ["pending"])] == ["finalize", "reveal:0xabc"]
    with (
        pytest.raises(IntegrityError),
        store.transaction() as session,
    ):  # the schema itself refuses a duplicate
        session.add(
            OutboxRow(unit_id=unit_id, action="finalize", payload_json="{}", created_at=0, updated_at=0)
        )
    with store.transaction() as session:
        assert len(store.outbox_in(session, ["pending"])) == 2  # the failed transaction left nothing


def test_one_replica_per_provider_per_unit(store: MarketStore) -> None:
    unit_id = seed_unit(store)
    with store.transaction() as session:
        session.add(ReplicaRow(unit_id=unit_id, index=0, provider="0x" + "a" * 40))
    with pytest.raises(IntegrityError), store.transaction() as session:
        session.add(ReplicaRow(unit_id=unit_id, index=1, provider="0x" + "a" * 40))


def test_stale_agents_and_cursor(store: MarketStore) -> None:
    with store.transaction() as session:
        for i, seen in enumerate((100, 200)):
            address = f"0x{i:040x}"
            session.add(
                AgentRow(
                    address=address,
                    role="provider",
                    operator=address,
                    memory_mb=1,
                    gflops=1,
                    hardware_class="cpu",
                    registered_at=0,
                )
            )
            session.add(HeartbeatRow(agent=address, last_nonce=2**70, last_timestamp=seen, received_at=seen))
    with store.transaction() as session:
        assert [a.address for a in store.stale_agents(session, received_before=150)] == [f"0x{0:040x}"]
        assert store.heartbeat_of(session, f"0x{1:040x}").last_nonce == 2**70  # type: ignore[union-attr]
        cursor = store.cursor(session)
        assert cursor.next_block == 0
        cursor.next_block = 42
        session.add(cursor)
    with store.transaction() as session:
        assert store.cursor(session).next_block == 42


def test_missing_rows_raise_not_found(store: MarketStore) -> None:
    with store.transaction() as session:
        for lookup in (
            lambda: store.get_unit(session, 99),
            lambda: store.get_order(session, 99),
            lambda: store.get_agent(session, "0x" + "0" * 40),
            lambda: store.get_job(session, 1),
        ):
            with pytest.raises(NotFound):
                lookup()


def test_an_older_database_gets_the_newer_nullable_columns_and_keeps_its_rows(store: MarketStore) -> None:
    """A market upgraded in place: its replicas table predates a column (dropped here to stand for an
    older version); create_schema adds it back empty, with every row and the rest of the data kept."""
    unit_id = seed_unit(store)
    with store.transaction() as session:
        session.add(ReplicaRow(unit_id=unit_id, index=0, provider="0x" + "aa" * 20, transcript_root="0x01"))
    with store.engine.begin() as connection:
        connection.execute(text('ALTER TABLE "replicas" DROP COLUMN "transcript_root"'))
    assert "transcript_root" not in {c["name"] for c in inspect(store.engine).get_columns("replicas")}
    store.create_schema()
    store.create_schema()  # and again: nothing left to add
    with store.transaction() as session:
        (replica,) = store.replicas_of(session, unit_id)
        assert (replica.provider, replica.transcript_root) == ("0x" + "aa" * 20, None)


def test_a_missing_column_that_cannot_be_null_is_a_clear_error(store: MarketStore) -> None:
    with store.engine.begin() as connection:
        connection.execute(text('ALTER TABLE "replicas" DROP COLUMN "index"'))
    with pytest.raises(MarketError, match="replicas lacks column index, which is not nullable"):
        store.create_schema()
