"""Signed agent messages (veritrain.messages): round trips, tamper and replay rejection, strict parsing."""

from __future__ import annotations

import pytest
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from veritrain.errors import InvalidSignature, ReplayedMessage
from veritrain.messages import (
    UINT64_MAX,
    AgentRole,
    Heartbeat,
    Offer,
    OrderSpec,
    Registration,
    Signed,
    default_checkpoint_every,
    require_fresh,
    sign_message,
    verify_signed,
)
from veritrain.settings import load_settings

KEY = Account.from_key("0x" + "42" * 32)
OTHER = Account.from_key("0x" + "43" * 32)

uint64 = st.integers(min_value=0, max_value=UINT64_MAX)


@settings(max_examples=60, deadline=None)
@given(nonce=uint64, timestamp=uint64, price=st.integers(min_value=0, max_value=2**256 - 1), expires=uint64)
def test_offer_round_trips_through_json_and_verifies(
    nonce: int, timestamp: int, price: int, expires: int
) -> None:
    offer = Offer(
        agent=KEY.address, nonce=nonce, timestamp=timestamp, price_per_pflop=price, expires_at=expires
    )
    signed = sign_message(offer, KEY.key, 31337)
    parsed = Signed[Offer].model_validate_json(signed.model_dump_json())
    assert parsed == signed
    assert verify_signed(parsed, 31337) == offer


@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["nonce", "timestamp", "busy"]), chain_id=st.integers(min_value=1, max_value=2**32)
)
def test_any_changed_field_or_domain_breaks_the_signature(field: str, chain_id: int) -> None:
    beat = Heartbeat(agent=KEY.address, nonce=5, timestamp=1000, busy=False)
    signed = sign_message(beat, KEY.key, 31337)
    changed = {"nonce": 6, "timestamp": 1001, "busy": True}[field]
    tampered = signed.model_copy(update={"message": beat.model_copy(update={field: changed})})
    with pytest.raises(InvalidSignature):
        verify_signed(tampered, 31337)
    if chain_id != 31337:
        with pytest.raises(InvalidSignature):
            verify_signed(signed, chain_id)


def test_signature_bytes_flipped_or_signed_by_another_key_are_refused() -> None:
    registration = Registration(
        agent=KEY.address,
        nonce=1,
        timestamp=1,
        role=AgentRole.PROVIDER,
        operator=KEY.address,
        memory_mb=1024,
        gflops=10,
        hardware_class="cpu",
        recipes=("digits-mlp",),
    )
    signed = sign_message(registration, KEY.key, 1)
    for position in (2, 40, 100, 129):
        flipped = list(signed.signature)
        flipped[position] = "0" if flipped[position] != "0" else "1"
        with pytest.raises(InvalidSignature):
            verify_signed(signed.model_copy(update={"signature": "".join(flipped)}), 1)
    impostor = sign_message(registration, OTHER.key, 1)
    with pytest.raises(InvalidSignature, match="signed by"):
        verify_signed(impostor, 1)


@pytest.mark.parametrize(
    "body",
    [
        {"agent": KEY.address, "nonce": -1, "timestamp": 0},  # negative
        {"agent": KEY.address, "nonce": 2**64, "timestamp": 0},  # overflows uint64
        {"agent": "0x1234", "nonce": 1, "timestamp": 0},  # not an address
        {"agent": KEY.address, "nonce": 1, "timestamp": 0, "extra": 1},  # unknown field
        {"agent": KEY.address, "nonce": "1e3", "timestamp": 0},  # not an integer
    ],
)
def test_malformed_messages_are_rejected_by_the_model(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Heartbeat.model_validate(body)


def test_replay_rules() -> None:
    require_fresh(None, None, nonce=1, timestamp=100, now=100, max_skew_s=10)
    require_fresh(1, 100, nonce=2, timestamp=100, now=105, max_skew_s=10)  # same second, higher nonce: fine
    with pytest.raises(ReplayedMessage, match="nonce"):
        require_fresh(2, 100, nonce=2, timestamp=101, now=101, max_skew_s=10)
    with pytest.raises(ReplayedMessage, match="older"):
        require_fresh(2, 100, nonce=3, timestamp=99, now=100, max_skew_s=10)
    with pytest.raises(ReplayedMessage, match="market clock"):
        require_fresh(2, 100, nonce=3, timestamp=200, now=100, max_skew_s=10)


def test_order_spec_hash_is_canonical_and_binds_every_field() -> None:
    spec = OrderSpec(
        buyer=KEY.address.lower(),
        recipe="digits-mlp",
        dataset_digest="0x" + "AB" * 32,
        total_steps=10,
        unit_steps=5,
        replicas=3,
        seed=1,
        max_price_per_pflop=10,
        deadline=99,
    )
    same = OrderSpec.model_validate_json(spec.model_dump_json())
    assert same.spec_hash() == spec.spec_hash() and spec.buyer == KEY.address  # checksummed on the way in
    assert spec.dataset_digest == "0x" + "ab" * 32
    assert spec.unit_count == 2
    changes = {"seed": 2, "replicas": 4, "max_price_per_pflop": 11, "deadline": 100, "checkpoint_every": 2}
    for field, value in changes.items():
        assert spec.model_copy(update={field: value}).spec_hash() != spec.spec_hash()
    with pytest.raises(ValidationError):
        OrderSpec.model_validate({**spec.model_dump(), "replicas": 6})


def test_checkpoint_interval_comes_from_the_spec_or_the_default_rule() -> None:
    assert [default_checkpoint_every(s) for s in (40, 3, 41)] == [10, 1, 11]
    fields = {
        "buyer": KEY.address,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "ab" * 32,
        "total_steps": 40,
        "unit_steps": 20,
        "replicas": 3,
        "seed": 1,
        "max_price_per_pflop": 10,
        "deadline": 99,
    }
    assert OrderSpec.model_validate(fields).checkpoint_every_for(20) == 5
    assert OrderSpec.model_validate({**fields, "checkpoint_every": 7}).checkpoint_every_for(20) == 7
    assert OrderSpec.model_validate({**fields, "checkpoint_every": 50}).checkpoint_every_for(20) == 20
    with pytest.raises(ValidationError):
        OrderSpec.model_validate({**fields, "checkpoint_every": 0})


def test_settings_defaults_are_embedded_and_overridable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("VERITRAIN_DATABASE_URL", raising=False)
    monkeypatch.setenv("VERITRAIN_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.database_url == f"sqlite:///{tmp_path}/market.sqlite3"
    assert settings.uses_filesystem_broker and settings.broker_transport_options()["data_folder_in"]
    monkeypatch.setenv("VERITRAIN_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("VERITRAIN_BROKER_URL", "redis://h:6379/0")
    scaled = load_settings()
    assert scaled.database_url.startswith("postgresql") and not scaled.uses_filesystem_broker
    assert scaled.broker_transport_options() == {}
