"""One typed exception tree for everything the chain can throw at us, whichever backend raised it.

A contract revert arrives differently per backend: the in-process EVM (eth-tester) raises
`TransactionFailed` with the raw revert bytes in its message or mines a failed receipt, a JSON-RPC
node answers with an error carrying the revert data, web3 wraps some of these in
`ContractLogicError`/`ContractCustomError`. `veritrain.chain.revert` turns all of them into the same
subclass of `ContractReverted` by decoding the 4-byte selector and arguments from the committed ABIs,
so callers write `except InvalidSigner` and never look at a selector.
"""

from __future__ import annotations

from typing import Any, ClassVar

from veritrain.errors import VeritrainError


class ChainError(VeritrainError):
    """Base of every error from the settlement plane (node, transaction, contract)."""


class RpcUnavailable(ChainError):
    """The JSON-RPC endpoint (or the local node we tried to start) does not answer."""


class WrongChainId(ChainError):
    """The node's chain id differs from the one the deployments file or the signed domain was made for."""

    def __init__(self, expected: int, actual: int, where: str = "") -> None:
        self.expected = expected
        self.actual = actual
        suffix = f" ({where})" if where else ""
        super().__init__(f"chain id {actual} where {expected} was expected{suffix}")


class TransactionTimeout(ChainError):
    """A sent transaction was not mined within the timeout; its nonce may still be pending."""

    def __init__(self, tx_hash: str, timeout: float) -> None:
        self.tx_hash = tx_hash
        self.timeout = timeout
        super().__init__(f"transaction {tx_hash} not mined within {timeout:g} s")


class DeploymentError(ChainError):
    """A deployments file or the contract data shipped with the package is missing or inconsistent."""


class ContractReverted(ChainError):
    """A contract call reverted. `name` is the Solidity error name, `arguments` its decoded arguments.

    Subclasses exist for every custom error of the Veritrain ABIs; `error_class(name)` maps a name to
    its class (an unknown name gets a subclass made on first use, so decoding never loses the name).
    """

    error_name: ClassVar[str] = ""

    def __init__(
        self, name: str, arguments: dict[str, Any] | None = None, *, tx_hash: str | None = None
    ) -> None:
        self.name = name
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.tx_hash = tx_hash
        shown = ", ".join(f"{key}={_show(value)}" for key, value in self.arguments.items())
        where = f" in tx {tx_hash}" if tx_hash else ""
        super().__init__(f"reverted {name}({shown}){where}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.name, self.arguments, self.tx_hash))


def _show(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return str(value)


class UnknownRevert(ContractReverted):
    """Reverted without data we can decode (out of gas, invalid opcode, an error not in our ABIs)."""

    error_name = "UnknownRevert"


class RevertedWithReason(ContractReverted):
    """`require(cond, "reason")` / `revert("reason")`: Solidity's Error(string)."""

    error_name = "Error"


class ContractPanic(ContractReverted):
    """Solidity Panic(uint256): an assertion, overflow, division by zero, out-of-bounds index."""

    error_name = "Panic"


# ---- custom errors of the Veritrain ABIs (contracts/*.sol and the OpenZeppelin code they use) ----
# tests/chain/test_errors.py checks that every error in veritrain/contracts_data has a class here.


class SignatureRejected(ContractReverted):
    """A signed message (EIP-712 action, ERC-2612 permit) was refused: wrong signer, nonce or deadline."""


# -- signatures (shared by JobMarket and StakeManager; ERC-2612 and ECDSA from OpenZeppelin)


class InvalidSigner(SignatureRejected):
    """A signature recovered another address than its claimed party (wrong key, chain id or contract)."""

    error_name = "InvalidSigner"


class InvalidNonce(SignatureRejected):
    """A signed message's nonce is not the account's next one (a replay, or out of order)."""

    error_name = "InvalidNonce"


class SignatureExpired(SignatureRejected):
    """A signed message's deadline has passed."""

    error_name = "SignatureExpired"


class ERC2612ExpiredSignature(SignatureRejected):
    """The ERC-2612 permit's deadline has passed."""

    error_name = "ERC2612ExpiredSignature"


class ERC2612InvalidSigner(SignatureRejected):
    """The ERC-2612 permit was not signed by the owner (or a nonce was reused)."""

    error_name = "ERC2612InvalidSigner"


class InvalidAccountNonce(SignatureRejected):
    """OpenZeppelin Nonces: an out-of-order nonce."""

    error_name = "InvalidAccountNonce"


class ECDSAInvalidSignature(SignatureRejected):
    """OpenZeppelin ECDSA: the signature does not recover any address."""

    error_name = "ECDSAInvalidSignature"


class ECDSAInvalidSignatureLength(SignatureRejected):
    """OpenZeppelin ECDSA: the signature is not 64/65 bytes."""

    error_name = "ECDSAInvalidSignatureLength"


class ECDSAInvalidSignatureS(SignatureRejected):
    """OpenZeppelin ECDSA: malleable (high-s) signature."""

    error_name = "ECDSAInvalidSignatureS"


# -- stake and tokens


class InsufficientFreeStake(ContractReverted):
    """Bonded minus locked stake does not cover the amount (unstake below collateral, lock)."""

    error_name = "InsufficientFreeStake"


class NothingToWithdraw(ContractReverted):
    """No credit / no unbonding stake to withdraw (e.g. a second withdrawal)."""

    error_name = "NothingToWithdraw"


class StakeStillThawing(ContractReverted):
    """Unbonding stake is withdrawable only after its thaw time."""

    error_name = "StakeStillThawing"


class ZeroAmount(ContractReverted):
    """A positive amount was required."""

    error_name = "ZeroAmount"


class TransferAmountMismatch(ContractReverted):
    """The token moved another amount than requested (fee-on-transfer tokens are unsupported)."""

    error_name = "TransferAmountMismatch"


class InvalidParameter(ContractReverted):
    """A constructor argument is unusable."""

    error_name = "InvalidParameter"


# -- orders


class ZeroUnits(ContractReverted):
    """An order needs at least one unit."""

    error_name = "ZeroUnits"


class InvalidReplicaCount(ContractReverted):
    """Replicas per unit must be 1..5."""

    error_name = "InvalidReplicaCount"


class InvalidReplicaBounds(ContractReverted):
    """An adaptive order needs 1 <= minReplicas <= maxReplicas."""

    error_name = "InvalidReplicaBounds"


class InvalidDeadline(ContractReverted):
    """The order deadline is not in the future."""

    error_name = "InvalidDeadline"


class UnknownOrder(ContractReverted):
    """No order has this id."""

    error_name = "UnknownOrder"


class OrderNotOpen(ContractReverted):
    """The order is closed."""

    error_name = "OrderNotOpen"


class OrderExpired(ContractReverted):
    """The order's deadline passed; it takes no more assignments."""

    error_name = "OrderExpired"


class OrderNotClosable(ContractReverted):
    """Only the buyer may close an order before its deadline."""

    error_name = "OrderNotClosable"


class UnitsStillOpen(ContractReverted):
    """An order cannot close while some of its units are unsettled."""

    error_name = "UnitsStillOpen"


class NoUnitBudget(ContractReverted):
    """The order has no unit left to assign, or its balance does not cover one."""

    error_name = "NoUnitBudget"


# -- assignment


class ProviderCountMismatch(ContractReverted):
    """Providers (or their acceptances) are not within the order's replica bounds (or not one each)."""

    error_name = "ProviderCountMismatch"


class ProviderNotTrusted(ContractReverted):
    """A unit with fewer than the order's most replicas takes only providers with the order's streak."""

    error_name = "ProviderNotTrusted"


class InvalidVerifierCount(ContractReverted):
    """Verifiers must number between the quorum and the cap."""

    error_name = "InvalidVerifierCount"


class DuplicateParty(ContractReverted):
    """An address appears twice among a unit's parties, or signs a verdict twice."""

    error_name = "DuplicateParty"


class NotAssignedProvider(ContractReverted):
    """The account is not one of the unit's providers."""

    error_name = "NotAssignedProvider"


class NotAssignedVerifier(ContractReverted):
    """The account is not one of the unit's verifiers."""

    error_name = "NotAssignedVerifier"


# -- unit life cycle


class InvalidUnitState(ContractReverted):
    """The unit's state machine does not allow this action (or the unit does not exist)."""

    error_name = "InvalidUnitState"


class UnitAlreadySettled(ContractReverted):
    """The unit was already finalized, verdicted or expired (no double settlement)."""

    error_name = "UnitAlreadySettled"


class CommitWindowClosed(ContractReverted):
    """A commitment arrived after the unit's commit deadline."""

    error_name = "CommitWindowClosed"


class AlreadyCommitted(ContractReverted):
    """The provider already committed."""

    error_name = "AlreadyCommitted"


class RevealWindowNotOpen(ContractReverted):
    """Reveals open once every replica committed or the commit deadline passed."""

    error_name = "RevealWindowNotOpen"


class RevealTooEarly(ContractReverted):
    """Reveals open in the block after the last commit (whose hash draws the spot check): retry next block."""

    error_name = "RevealTooEarly"


class RevealWindowClosed(ContractReverted):
    """The reveal phase is over."""

    error_name = "RevealWindowClosed"


class NotCommitted(ContractReverted):
    """The provider never committed, so there is nothing to reveal."""

    error_name = "NotCommitted"


class AlreadyRevealed(ContractReverted):
    """The provider already revealed."""

    error_name = "AlreadyRevealed"


class RevealMismatch(ContractReverted):
    """The revealed (digest, salt) does not hash to the provider's commitment."""

    error_name = "RevealMismatch"


class RevealsIncomplete(ContractReverted):
    """Finalize needs every replica revealed."""

    error_name = "RevealsIncomplete"


class NotUnanimous(ContractReverted):
    """The revealed digests differ: the unit needs a verdict."""

    error_name = "NotUnanimous"


class UnitUnderVerification(ContractReverted):
    """The unit was drawn for a spot check: it settles by verdict or expiry only."""

    error_name = "UnitUnderVerification"


class FinalizeReserved(ContractReverted):
    """Until the verdict deadline only the operator finalizes (it checks canaries' known answers first)."""

    error_name = "FinalizeReserved"


class UnitFinalizable(ContractReverted):
    """A unanimous unit nobody drew is finalized, never expired (its providers' pay is not the buyer's)."""

    error_name = "UnitFinalizable"


class VerdictWindowNotOpen(ContractReverted):
    """Verdicts open once every replica revealed or the reveal deadline passed."""

    error_name = "VerdictWindowNotOpen"


class VerdictWindowClosed(ContractReverted):
    """The verdict phase is over (the unit can only expire)."""

    error_name = "VerdictWindowClosed"


class OutcomeCountMismatch(ContractReverted):
    """A verdict needs exactly one outcome per replica."""

    error_name = "OutcomeCountMismatch"


class VerdictMismatch(ContractReverted):
    """settleHeld was given outcomes other than the ones that settled the unit."""

    error_name = "VerdictMismatch"


class InvalidOutcome(ContractReverted):
    """Unknown outcome, or accept/fraud for a replica that never revealed."""

    error_name = "InvalidOutcome"


class QuorumNotReached(ContractReverted):
    """Fewer valid distinct assigned-verifier signatures than a majority of the unit's verifiers."""

    error_name = "QuorumNotReached"


class UnitNotExpired(ContractReverted):
    """A unit can expire only after its verdict deadline."""

    error_name = "UnitNotExpired"


class ReplicaIndexOutOfRange(ContractReverted):
    """Replica index beyond the unit's replica count."""

    error_name = "ReplicaIndexOutOfRange"


class EmptyBatch(ContractReverted):
    """commitBatch / revealBatch got no entries (an empty batch is a caller bug, not a no-op)."""

    error_name = "EmptyBatch"


class AcceptNonceUsed(ContractReverted):
    """The provider already used this unordered Accept nonce (a replayed acceptance)."""

    error_name = "AcceptNonceUsed"


class NoVerdict(ContractReverted):
    """An appeal or contradiction evidence needs a unit that a verdict settled (VerdictAppeals)."""

    error_name = "NoVerdict"


class VerdictNotContradicted(ContractReverted):
    """The verifier's signed outcomes equal the unit's truth: it agreed, nothing to slash."""

    error_name = "VerdictNotContradicted"


class VerifierAlreadySlashed(ContractReverted):
    """The verifier was already slashed for contradicting this unit's truth."""

    error_name = "VerifierAlreadySlashed"


class AppealWindowClosed(ContractReverted):
    """Appeals of the unit closed `appealWindow` after its verdict deadline."""

    error_name = "AppealWindowClosed"


class AlreadyAppealed(ContractReverted):
    """The unit already has an appeal (one per unit)."""

    error_name = "AlreadyAppealed"


class NoPendingAppeal(ContractReverted):
    """The unit has no pending appeal (none filed, or already decided or lapsed)."""

    error_name = "NoPendingAppeal"


class DrawTooEarly(ContractReverted):
    """The panel is drawn from the appeal block's hash, readable from the next block on."""

    error_name = "DrawTooEarly"


class PanelAlreadyDrawn(ContractReverted):
    """The appeal's panel was already drawn."""

    error_name = "PanelAlreadyDrawn"


class PanelUndrawable(ContractReverted):
    """The referee pool has too few eligible referees for a panel."""

    error_name = "PanelUndrawable"


class PanelNotDrawn(ContractReverted):
    """A vote before the appeal's panel was drawn."""

    error_name = "PanelNotDrawn"


class VoteWindowClosed(ContractReverted):
    """The appeal's vote deadline passed."""

    error_name = "VoteWindowClosed"


class NotOnPanel(ContractReverted):
    """The referee does not sit on the unit's appeal panel."""

    error_name = "NotOnPanel"


class AlreadyVoted(ContractReverted):
    """The referee already voted on this appeal (a replayed or changed vote)."""

    error_name = "AlreadyVoted"


class AlreadyDecided(ContractReverted):
    """A majority of the panel already decided the appeal."""

    error_name = "AlreadyDecided"


class OutcomesMismatch(ContractReverted):
    """The outcomes given do not hash to the verdict, or to the panel's decision."""

    error_name = "OutcomesMismatch"


class NotDecided(ContractReverted):
    """The panel has not decided the appeal yet."""

    error_name = "NotDecided"


class AppealNotLapsed(ContractReverted):
    """An appeal lapses only after its vote deadline without a decision."""

    error_name = "AppealNotLapsed"


class TruthNotFixed(ContractReverted):
    """The unit's appeal window is open or its appeal undecided: no verifier can be slashed yet."""

    error_name = "TruthNotFixed"


class AppealLapsed(ContractReverted):
    """The unit's appeal lapsed undecided: nobody can be slashed for contradicting it."""

    error_name = "AppealLapsed"


class AlreadyInPool(ContractReverted):
    """The account is already in the referee pool."""

    error_name = "AlreadyInPool"


class NotInPool(ContractReverted):
    """The account is not in the referee pool."""

    error_name = "NotInPool"


class PartyRegistryFull(ContractReverted):
    """All 2**24 - 1 compact party ids are taken: no new address can be assigned to a unit."""

    error_name = "PartyRegistryFull"


# -- round path (JobMarketRounds)


class RosterExists(ContractReverted):
    """The order already has a roster."""

    error_name = "RosterExists"


class RosterNotOpen(ContractReverted):
    """The order has no roster, or its roster is closed."""

    error_name = "RosterNotOpen"


class InvalidLayout(ContractReverted):
    """A roster's layout names a provider out of range, twice in one unit or never, or has too many slots."""

    error_name = "InvalidLayout"


class RosterMismatch(ContractReverted):
    """The providers and layout given are not the roster's."""

    error_name = "RosterMismatch"


class EntryCountMismatch(ContractReverted):
    """A round step's openings or works do not cover every replica slot of the round."""

    error_name = "EntryCountMismatch"


class NoRoundToStep(ContractReverted):
    """Every round of the roster is committed already."""

    error_name = "NoRoundToStep"


class RoundHashMismatch(ContractReverted):
    """A round's openings do not hash to its recorded commitments."""

    error_name = "RoundHashMismatch"


class RoundRevealTooEarly(ContractReverted):
    """A round is revealed only in a later block than the one that committed it."""

    error_name = "RoundRevealTooEarly"


class RoundUnitNeedsVerdict(ContractReverted):
    """A unit of the round was drawn or its replicas disagree: the round path does not settle it."""

    error_name = "RoundUnitNeedsVerdict"


class RoundRevealWindowOpen(ContractReverted):
    """A round's slots may be given as withheld only after its reveal window."""

    error_name = "RoundRevealWindowOpen"


class RosterNotClosable(ContractReverted):
    """The roster has rounds left to settle and the order's deadline has not passed."""

    error_name = "RosterNotClosable"


class AuditorsMismatch(ContractReverted):
    """The roster verifiers given are not the roster's own (or it has none)."""

    error_name = "AuditorsMismatch"


class AuditMismatch(ContractReverted):
    """The audit records (or the pending audit chain) given are not the roster's, or the record given is
    not a round's."""

    error_name = "AuditMismatch"


class AuditsPending(ContractReverted):
    """The roster has round audit records no posting covers yet: it cannot close before one does."""

    error_name = "AuditsPending"


class NotAudited(ContractReverted):
    """The unit was not paid by its round's audit, or was already challenged."""

    error_name = "NotAudited"


class AuditChallengeClosed(ContractReverted):
    """Challenges of the unit's audit closed (the covering posting's time plus verdictWindow)."""

    error_name = "AuditChallengeClosed"


class AuditNotContradicted(ContractReverted):
    """The challenged unit's truth has no fraud: the signers of its round audit told the truth."""

    error_name = "AuditNotContradicted"


class NotDelegated(ContractReverted):
    """An extension (JobMarketExtension, JobMarketRoundsExtension) called on its own address: its code runs
    only inside JobMarket (delegatecall)."""

    error_name = "NotDelegated"


# -- OpenZeppelin access control, tokens and guards


class AccessControlUnauthorizedAccount(ContractReverted):
    """The caller lacks the role (e.g. assign by a non-operator)."""

    error_name = "AccessControlUnauthorizedAccount"


class AccessControlBadConfirmation(ContractReverted):
    """OpenZeppelin AccessControl: renounceRole for another account."""

    error_name = "AccessControlBadConfirmation"


class OwnableUnauthorizedAccount(ContractReverted):
    """The caller is not the owner (e.g. mint by a non-owner)."""

    error_name = "OwnableUnauthorizedAccount"


class OwnableInvalidOwner(ContractReverted):
    """OpenZeppelin Ownable: the zero address cannot own."""

    error_name = "OwnableInvalidOwner"


class ERC20InsufficientBalance(ContractReverted):
    """The sender holds fewer tokens than the transfer."""

    error_name = "ERC20InsufficientBalance"


class ERC20InsufficientAllowance(ContractReverted):
    """The spender's allowance is below the transfer (approve first)."""

    error_name = "ERC20InsufficientAllowance"


class ERC20InvalidApprover(ContractReverted):
    """OpenZeppelin ERC20: approval from the zero address."""

    error_name = "ERC20InvalidApprover"


class ERC20InvalidReceiver(ContractReverted):
    """OpenZeppelin ERC20: transfer to the zero address."""

    error_name = "ERC20InvalidReceiver"


class ERC20InvalidSender(ContractReverted):
    """OpenZeppelin ERC20: transfer from the zero address."""

    error_name = "ERC20InvalidSender"


class ERC20InvalidSpender(ContractReverted):
    """OpenZeppelin ERC20: approval to the zero address."""

    error_name = "ERC20InvalidSpender"


class InvalidShortString(ContractReverted):
    """OpenZeppelin ShortStrings: malformed short string."""

    error_name = "InvalidShortString"


class StringTooLong(ContractReverted):
    """OpenZeppelin ShortStrings: string longer than 31 bytes."""

    error_name = "StringTooLong"


class ReentrancyGuardReentrantCall(ContractReverted):
    """A re-entrant call into a nonReentrant function."""

    error_name = "ReentrancyGuardReentrantCall"


class SafeCastOverflowedUintDowncast(ContractReverted):
    """A value does not fit the narrower integer type (e.g. escrow > 2**128)."""

    error_name = "SafeCastOverflowedUintDowncast"


class SafeERC20FailedOperation(ContractReverted):
    """The token's transfer returned false or reverted without data."""

    error_name = "SafeERC20FailedOperation"


# -- OpenZeppelin TimelockController (the contracts' admin after `veritrain chain deploy`)


class TimelockInvalidOperationLength(ContractReverted):
    """A batch operation's targets, payloads and values differ in length."""

    error_name = "TimelockInvalidOperationLength"


class TimelockInsufficientDelay(ContractReverted):
    """An operation was scheduled with less than the timelock's minimum delay."""

    error_name = "TimelockInsufficientDelay"


class TimelockUnexpectedOperationState(ContractReverted):
    """The operation is not in the state the call needs (e.g. executed before it is ready)."""

    error_name = "TimelockUnexpectedOperationState"


class TimelockUnexecutedPredecessor(ContractReverted):
    """The operation's predecessor has not been executed."""

    error_name = "TimelockUnexecutedPredecessor"


class TimelockUnauthorizedCaller(ContractReverted):
    """Only the timelock itself may change its own delay."""

    error_name = "TimelockUnauthorizedCaller"


class FailedCall(ContractReverted):
    """OpenZeppelin Address: a call the timelock executed reverted without data."""

    error_name = "FailedCall"


_REGISTRY: dict[str, type[ContractReverted]] = {}


def _register_declared(base: type[ContractReverted]) -> None:
    for sub in base.__subclasses__():
        if sub.error_name:
            _REGISTRY[sub.error_name] = sub
        _register_declared(sub)


_register_declared(ContractReverted)
_DECLARED = frozenset(_REGISTRY)


def error_class(name: str) -> type[ContractReverted]:
    """The exception class of Solidity error `name`; made (a ContractReverted subclass) if undeclared."""
    cls = _REGISTRY.get(name)
    if cls is None:
        cls = type(name, (ContractReverted,), {"error_name": name, "__doc__": f"Solidity error {name}."})
        _REGISTRY[name] = cls
    return cls


def declared_error_names() -> frozenset[str]:
    """Names that have a class written in this module (the rest are made on first use)."""
    return _DECLARED


def _rebuild(name: str, arguments: dict[str, Any], tx_hash: str | None) -> ContractReverted:
    return error_class(name)(name, arguments, tx_hash=tx_hash)
