"""Getting a key's stake out of the StakeManager: start unbonding its free stake, take the thawed stake back.

Why in the kernel: the wallet CLI (apps/wallet.py) does it for any key by hand and the plant runner
(node/plant.py) for its caught keys unattended, and both must check each refusal the contract would make
(no free stake, the rest locked as collateral of open units; nothing unbonding; not thawed yet) before
sending, so that a refusal is a typed error (`InvalidInput`) and costs no transaction. The key pays the
gas of its own transactions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veritrain.errors import InvalidInput

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from veritrain.chain.client import ChainClient

TOKEN = 10**18


def veri(amount: int) -> str:
    """Base units as VERI for people, exact (no float rounding)."""
    whole, fraction = divmod(amount, TOKEN)
    return f"{whole}.{fraction:018d}".rstrip("0").rstrip(".") + " VERI"


def unstake(client: ChainClient, account: LocalAccount, amount: int | None = None) -> int:
    """Start unbonding `amount` of the account's free stake (None: all of it); returns the amount. A new
    request restarts the thaw of everything already unbonding (StakeManager keeps one `thawAt`)."""
    stake = client.stake_of(account)
    amount = stake.free if amount is None else amount
    if not 0 < amount <= stake.free:
        raise InvalidInput(
            f"{account.address} has {veri(stake.free)} of free stake ({veri(stake.locked)} of its "
            f"{veri(stake.bonded)} bonded is locked as collateral of open units): cannot unstake "
            f"{veri(amount)}"
        )
    client.request_unstake(account, amount)
    return amount


def release(client: ChainClient, account: LocalAccount) -> int:
    """Withdraw all of the account's thawed unbonding stake into its wallet; returns the amount."""
    stake = client.stake_of(account)
    if stake.unbonding == 0:
        raise InvalidInput(f"{account.address} has no unbonding stake (`veritrain wallet unstake` first)")
    now = client.pending_time()  # the time the withdrawal would execute at
    if now < stake.thaw_at:
        raise InvalidInput(
            f"{veri(stake.unbonding)} of {account.address} thaws at {stake.thaw_at}, "
            f"{stake.thaw_at - now} s from now"
        )
    client.withdraw_stake(account)
    return stake.unbonding
