"""The demo's report: money accounting from on-chain figures, acceptance checks, loss curve and JSON.

Why separate from the orchestration: these are pure functions of numbers read from the chain and the
market, so they are unit-tested without starting a single process, and the e2e tests reuse the same
checks the demo applies to itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class OrderMoney:
    """Where one order's escrow went, every figure read from JobMarket events (token base units).

    `verdict_fees` is the verifier fee of every unit settled by verdict (split among its signing verifiers,
    rounding dust to the buyer); the fee of a fast-path unit goes back to the order and into the refund.
    A replica a verdict called fraud is held until the unit's truth is fixed; its price is then paid (an
    overturned verdict) or credited straight to the buyer (`held_refunds`, outside the order's refund);
    `held_replicas` counts those still held. `audit_fees`: a round-path order's roster verifiers' fees for
    the units of the audits they posted, paid at the roster's close.
    """

    deposit: int
    payouts: dict[str, int]
    verdict_fees: int
    refund: int
    slashed: dict[str, int]
    # VerifierSlashed: collateral of verifiers whose signature contradicted a verdict (bounty to its
    # reporter, the rest to the buyer: it nets to zero among verifier, buyer and reporter)
    slashed_verifiers: dict[str, int] = field(default_factory=dict)
    reporters: frozenset[str] = frozenset()
    held_refunds: int = 0
    held_replicas: int = 0
    audit_fees: int = 0

    @property
    def payouts_total(self) -> int:
        return sum(self.payouts.values())

    @property
    def slashed_total(self) -> int:
        return sum(self.slashed.values())

    @property
    def verifier_fees(self) -> int:
        """Every verifier fee the order paid: its verdicts' and its roster's audits'."""
        return self.verdict_fees + self.audit_fees

    def escrow_balanced(self) -> bool:
        """deposit = payouts + verifier fees + refund + held prices refunded, exactly; nothing still held."""
        spent = self.payouts_total + self.verifier_fees + self.refund + self.held_refunds
        return self.held_replicas == 0 and self.deposit == spent


@dataclass(frozen=True)
class Holdings:
    """Token holdings at one moment: per party its wallet, stake (bonded + unbonding) and market credit,
    plus what each contract holds and the total supply."""

    wallets: dict[str, int]
    stakes: dict[str, int]
    credits: dict[str, int]
    contracts: dict[str, int]
    total_supply: int

    def net(self, account: str) -> int:
        """Everything an account owns in the system: wallet + stake + credit."""
        return self.wallets.get(account, 0) + self.stakes.get(account, 0) + self.credits.get(account, 0)

    def accounted(self) -> int:
        """Tokens in the parties' wallets plus everything the contracts hold."""
        return sum(self.wallets.values()) + sum(self.contracts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "wallets": self.wallets,
            "stakes": self.stakes,
            "credits": self.credits,
            "contracts": self.contracts,
            "total_supply": self.total_supply,
        }


@dataclass
class Checks:
    """Named acceptance checks; the demo exits non-zero if any is False."""

    results: dict[str, bool] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.results[name] = bool(ok)
        if detail:
            self.details[name] = detail

    @property
    def all_ok(self) -> bool:
        return bool(self.results) and all(self.results.values())

    def failed(self) -> list[str]:
        return [name for name, ok in self.results.items() if not ok]


def conservation_checks(
    money: OrderMoney,
    before: Holdings,
    after: Holdings,
    *,
    buyer: str,
    providers: list[str],
    verifiers: list[str],
    checks: Checks,
) -> bool:
    """Check the money invariants between two on-chain snapshots (taken with no order open and all credit
    withdrawn); record each in `checks` and return True when all hold."""
    parties = {buyer, *providers, *verifiers}
    reporters = money.reporters - parties  # the market's sender earns a verifier slash's bounty
    delta = {account: after.net(account) - before.net(account) for account in parties | reporters}
    checks.check(
        "escrow_balanced",
        money.escrow_balanced(),
        f"deposit {money.deposit} = payouts {money.payouts_total} + verifier fees {money.verifier_fees} "
        f"+ refund {money.refund} + held prices refunded {money.held_refunds}; "
        f"{money.held_replicas} replicas still held",
    )
    wrong = {
        p: (delta[p], money.payouts.get(p, 0) - money.slashed.get(p, 0))
        for p in providers
        if delta[p] != money.payouts.get(p, 0) - money.slashed.get(p, 0)
    }
    checks.check("providers_paid_exactly", not wrong, f"(actual, expected) where they differ: {wrong}")
    buyer_extra = delta[buyer] + money.deposit - money.refund - money.held_refunds
    verifier_income = sum(delta[v] for v in verifiers)
    bounties = sum(delta[r] for r in reporters)
    checks.check(
        "fees_and_slashes_distributed",
        verifier_income + buyer_extra + bounties == money.verifier_fees + money.slashed_total,
        f"verifiers {verifier_income} + buyer's share {buyer_extra} + reporters {bounties} = fees "
        f"{money.verifier_fees} + slashed {money.slashed_total}",
    )
    checks.check("parties_conserved", sum(delta.values()) == 0, f"sum of net changes {sum(delta.values())}")
    checks.check(
        "supply_conserved",
        before.total_supply == after.total_supply == before.accounted() == after.accounted(),
        f"supply {before.total_supply}->{after.total_supply}, "
        f"accounted {before.accounted()}->{after.accounted()}",
    )
    names = (
        "escrow_balanced",
        "providers_paid_exactly",
        "fees_and_slashes_distributed",
        "parties_conserved",
        "supply_conserved",
    )
    return all(checks.results[name] for name in names)


def write_loss_curve(losses: Sequence[float], round_boundaries: Sequence[int], path: Path) -> None:
    """Plot per-step training loss of the accepted units (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(range(len(losses)), list(losses), linewidth=1.2, label="accepted units")
    for boundary in round_boundaries:
        axis.axvline(boundary, color="grey", linewidth=0.5, linestyle=":")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("training loss")
    axis.set_title("Veritrain demo: verified training loss")
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """Write demo-report.json (sorted keys, ints stay ints: money is never a float)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
