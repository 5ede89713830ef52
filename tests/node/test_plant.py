"""The operator's plant agent under keys spent one by one (node/plant.py): which key is current, in what
order a folder's keys are spent. The rotation itself runs end to end in tests/e2e/test_marketplace.py
(`test_a_planted_cheat_slashes_the_verifier_that_accepted_it_without_re_executing`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from eth_account import Account

from market.domain.replication import Reputation
from node.plant import current_plant, plant_keys
from veritrain.errors import KeystoreError
from veritrain.keys import encrypt_key, write_keystore


@dataclass
class Reputations:
    """The chain's `reputationOf` by address (pure selection logic needs no contract here)."""

    caught: set[str] = field(default_factory=set)

    def reputation(self, address: str) -> Reputation:
        return Reputation(valid=0, fault=0, fraud=int(address in self.caught), consecutive_valid=0)


def test_the_current_plant_key_is_the_first_never_caught_and_none_when_all_are() -> None:
    keys = [Account.create() for _ in range(3)]
    chain = Reputations()
    assert current_plant(chain, keys) == keys[0]  # type: ignore[arg-type]
    chain.caught |= {keys[0].address, keys[1].address}
    assert current_plant(chain, keys) == keys[2]  # type: ignore[arg-type]
    chain.caught.add(keys[2].address)
    assert current_plant(chain, keys) is None  # type: ignore[arg-type]


def test_a_folder_s_keys_are_spent_in_file_name_order_and_a_stray_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANT_PASSPHRASE", "s3cret")
    keys = [Account.create() for _ in range(3)]
    for name, key in zip(("plant-b", "plant-a", "plant-c"), keys, strict=True):
        write_keystore(tmp_path, name, encrypt_key(bytes(key.key), "s3cret", light=True))
    read = [key.address for key in plant_keys(tmp_path, "PLANT_PASSPHRASE")]
    assert read == [keys[1].address, keys[0].address, keys[2].address]
    (tmp_path / "plant-d.json").write_text("not a key\n")
    with pytest.raises(KeystoreError):
        list(plant_keys(tmp_path, "PLANT_PASSPHRASE"))
