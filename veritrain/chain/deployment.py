"""The deployments file: which contracts, at which addresses, on which chain, with which parameters.

Why a file: every process of the marketplace (market service, agents, verifiers) connects to the same
contracts; the file is what they share, and its chain id lets a client refuse a node of another chain
(`WrongChainId`) before it signs anything for the wrong domain.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from eth_utils import is_address, to_checksum_address

from veritrain.chain.errors import DeploymentError
from veritrain.messages import PROBATION_STREAK

DEPLOYMENTS_FORMAT = 1


@dataclass(frozen=True)
class MarketParams:
    """JobMarket's `Params` struct (immutable once deployed), in Solidity field order; seconds, base units."""

    commit_window: int = 3600
    reveal_window: int = 3600
    verdict_window: int = 3600
    min_verifiers: int = 2  # fewest verifiers a unit may have; a verdict needs a majority of the unit's
    bounty_bps: int = 5000
    provider_collateral: int = 100 * 10**18
    slash_amount: int = 50 * 10**18
    verifier_collateral: int = (
        10 * 10**18
    )  # locked per unit; slashed when its signature contradicts the verdict
    spot_check_ppm: int = 50_000  # market policy's base audit rate (units with several replicas)
    solo_spot_check_ppm: int = 200_000  # single-replica units: nothing else can contradict them
    # = slash_amount: withholding a reveal is never cheaper than being caught with a wrong result
    withhold_penalty: int = 50 * 10**18
    # a unit with a provider below this many consecutive valid units is drawn at assignment: a ring of
    # fresh keys is always verified; past it, the spot check and the slash decide (docs/VERIFICATION.md)
    probation_streak: int = PROBATION_STREAK

    def as_tuple(self) -> tuple[int, ...]:
        """The Solidity `Params` struct, field by field in declaration order."""
        return tuple(getattr(self, item.name) for item in fields(self))


@dataclass(frozen=True)
class AppealParams:
    """VerdictAppeals' `Params` struct, in Solidity field order; seconds, base units.

    The windows must satisfy commit_window + reveal_window + verdict_window + appeal_window + vote_window <
    unbonding period (the contract checks it): a verdict can land right after assignment and the appeal
    window runs from the verdict deadline, so a verifier that starts unstaking at settlement is still
    slashable when the panel decides."""

    appeal_window: int = 3600  # after the unit's verdict deadline
    vote_window: int = 7200  # after the appeal: draw, re-execute, vote
    panel_size: int = 3  # odd; a majority of equal votes decides
    bounty_bps: int = 5000  # of a slash: to the deciding referees, or to the reporter of a contradiction
    appeal_bond: int = 10 * 10**18  # the appellant's stake locked; lost to the referees when confirmed
    referee_stake: int = 10 * 10**18  # locked while in the referee pool (one draw weight per entry)
    # twice the verifier collateral: a colluding majority loses more than its fee share
    verifier_slash: int = 20 * 10**18

    def as_tuple(self) -> tuple[int, ...]:
        """The Solidity `Params` struct, field by field in declaration order."""
        return tuple(getattr(self, item.name) for item in fields(self))


@dataclass(frozen=True)
class Deployment:
    """One deployed Veritrain: chain id, addresses, deployment block and parameters."""

    chain_id: int
    token: str
    stake_manager: str
    job_market: str
    block: int
    deployer: str
    operator: str
    unbonding_period: int
    params: MarketParams
    verdict_appeals: str
    appeal_params: AppealParams = AppealParams()
    timelock: str = ""  # the AdminTimelock holding both admin roles ("": the deployer kept them)

    @property
    def addresses(self) -> dict[str, str]:
        named = {
            "VeriToken": self.token,
            "StakeManager": self.stake_manager,
            "JobMarket": self.job_market,
            "VerdictAppeals": self.verdict_appeals,
        }
        return {**named, "AdminTimelock": self.timelock} if self.timelock else named

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": DEPLOYMENTS_FORMAT,
            "chainId": self.chain_id,
            "addresses": self.addresses,
            "block": self.block,
            "deployer": self.deployer,
            "operator": self.operator,
            "params": {"unbondingPeriod": self.unbonding_period, **_camel(asdict(self.params))},
            "appealParams": _camel(asdict(self.appeal_params)),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Deployment:
        """Parse and validate; DeploymentError names the first bad field."""
        try:
            if raw.get("format") != DEPLOYMENTS_FORMAT:
                raise DeploymentError(f"unsupported deployments format {raw.get('format')!r}")
            addresses = raw["addresses"]
            params = dict(raw["params"])
            unbonding = params.pop("unbondingPeriod")
            market = MarketParams(**{_snake(key): _int(value, key) for key, value in params.items()})
            appeal = AppealParams(
                **{_snake(key): _int(v, key) for key, v in dict(raw["appealParams"]).items()}
            )
            return cls(
                chain_id=_int(raw["chainId"], "chainId"),
                token=_address(addresses["VeriToken"], "VeriToken"),
                stake_manager=_address(addresses["StakeManager"], "StakeManager"),
                job_market=_address(addresses["JobMarket"], "JobMarket"),
                block=_int(raw["block"], "block"),
                deployer=_address(raw["deployer"], "deployer"),
                operator=_address(raw["operator"], "operator"),
                unbonding_period=_int(unbonding, "unbondingPeriod"),
                params=market,
                verdict_appeals=_address(addresses["VerdictAppeals"], "VerdictAppeals"),
                appeal_params=appeal,
                timelock=_address(addresses["AdminTimelock"], "AdminTimelock")
                if "AdminTimelock" in addresses
                else "",
            )
        except DeploymentError:
            raise
        except (KeyError, TypeError, AttributeError) as err:
            raise DeploymentError(f"malformed deployments data: {type(err).__name__}: {err}") from err

    def save(self, path: Path | str) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(target)
        return target

    @classmethod
    def load(cls, path: Path | str) -> Deployment:
        source = Path(path)
        try:
            raw = json.loads(source.read_text())
        except FileNotFoundError:
            raise DeploymentError(f"no deployments file at {source}") from None
        except json.JSONDecodeError as err:
            raise DeploymentError(f"{source} is not JSON: {err}") from err
        if not isinstance(raw, dict):
            raise DeploymentError(f"{source} does not hold a JSON object")
        return cls.from_dict(raw)


def _camel(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "".join([key.split("_")[0], *(part.title() for part in key.split("_")[1:])]): v
        for key, v in values.items()
    }


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeploymentError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not is_address(value):
        raise DeploymentError(f"{what} is not an address: {value!r}")
    return to_checksum_address(value)
