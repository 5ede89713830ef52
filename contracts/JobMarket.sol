// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {TypedSignatures} from "./TypedSignatures.sol";
import {StakeManager} from "./StakeManager.sol";

/// @title JobMarketBase
/// @notice What {JobMarket} and {JobMarketExtension} share: parameters, storage layout, errors, events and
/// the internals both run. The verdict path lives in a contract of its own that {JobMarket} calls by
/// delegatecall (so it runs in JobMarket's storage, with its roles, balances and address), because
/// JobMarket with it was within a few hundred bytes of the 24,576-byte code limit (EIP-170).
abstract contract JobMarketBase is AccessControl, ReentrancyGuardTransient, TypedSignatures {
    using SafeERC20 for IERC20;

    /// @notice Role of the market service's relayer key, which proposes assignments and spot checks.
    bytes32 public constant OPERATOR_ROLE = keccak256("OPERATOR_ROLE");
    /// @notice Role of {VerdictAppeals}, which alone settles a verdict's held fraud by the unit's truth.
    bytes32 public constant APPEALS_ROLE = keccak256("APPEALS_ROLE");
    /// @notice Most replicas per unit.
    uint256 internal constant MAX_REPLICAS = 5;
    /// @notice Most verifiers per unit.
    uint256 internal constant MAX_VERIFIERS = 5;
    /// @notice Longest commit, reveal or verdict window (keeps every deadline far inside 40 bits).
    uint64 internal constant MAX_WINDOW = 365 days;
    /// @notice Replica outcomes in a verdict.
    uint8 internal constant OUTCOME_ACCEPT = 0;
    uint8 internal constant OUTCOME_FAULT = 1;
    uint8 internal constant OUTCOME_FRAUD = 2;

    bytes32 internal constant ACCEPT_TYPEHASH =
        keccak256("Accept(uint256 orderId,bytes32 unitKey,address provider,uint256 nonce,uint256 deadline)");
    bytes32 internal constant COMMIT_TYPEHASH =
        keccak256("Commit(uint256 unitId,address provider,bytes32 commitment,uint256 nonce,uint256 deadline)");
    bytes32 internal constant VERDICT_TYPEHASH = keccak256("Verdict(uint256 unitId,bytes32 outcomesHash,uint256 deadline)");
    bytes32 internal constant WITHDRAW_CREDIT_TYPEHASH =
        keccak256("WithdrawCredit(address account,uint256 nonce,uint256 deadline)");
    bytes32 internal constant UNIT_COMMIT_TYPEHASH =
        keccak256("UnitCommit(uint256 unitId,address provider,bytes32 commitment,uint256 deadline)");
    bytes32 internal constant ROUND_COMMIT_TYPEHASH = keccak256(
        "RoundCommit(uint256 orderId,uint256 round,address provider,bytes32 commitmentsHash,uint256 deadline)"
    );
    bytes32 internal constant ROUND_AUDIT_TYPEHASH =
        keccak256("RoundAudit(uint256 orderId,bytes32 records)");
    uint256 internal constant BPS = 10_000;
    uint256 internal constant PPM = 1_000_000;
    /// @dev A unit's parties are stored as 24-bit party ids, ten of which fill one slot.
    uint256 internal constant PARTY_ID_BITS = 24;
    uint256 internal constant PARTY_ID_MASK = (1 << PARTY_ID_BITS) - 1;
    /// @dev Number of recycled commitment pages (see {_pages}): more units open at once simply store
    /// their commitments per unit.
    uint256 internal constant COMMIT_PAGES = 128;

    /// @notice Life cycle of a unit. `Committing` stays stored until every replica committed; after the
    /// commit deadline such a unit is in its reveal phase all the same (see the time rules above).
    enum UnitState {
        None,
        Committing,
        Revealing,
        Finalized,
        Verdicted,
        Expired
    }

    /// @notice Market parameters, fixed at deployment.
    struct Params {
        uint64 commitWindow;
        uint64 revealWindow;
        uint64 verdictWindow;
        uint8 minVerifiers;
        uint16 bountyBps;
        uint256 providerCollateral;
        uint256 slashAmount;
        uint256 verifierCollateral;
        /// @dev Spot-check rate of units with several replicas, in parts per million.
        uint32 spotCheckPpm;
        /// @dev Spot-check rate of single-replica units (no replica can contradict them), ppm.
        uint32 soloSpotCheckPpm;
        /// @dev Stake lost by a replica that committed but did not reveal in time (<= slashAmount).
        uint256 withholdPenalty;
        /// @dev Consecutive valid units a provider needs before its units may skip verification: a unit
        /// with any provider below it is drawn at assignment (fresh sybil keys cannot pass unchecked).
        uint16 probationStreak;
    }

    /// @notice An order (three storage slots).
    struct Order {
        address buyer;
        uint64 deadline;
        uint32 units;
        uint128 pricePerReplica;
        uint128 verifierFeePerUnit;
        uint128 balance;
        uint32 delivered;
        uint32 openUnits;
        uint8 replicas; // the most providers a unit may have (all of them for a fixed order)
        bool closed;
        uint8 minReplicas; // the fewest; below `replicas` only for providers past `trustedStreak`
        uint16 trustedStreak; // consecutive valid units a provider needs to be assigned a reduced unit
    }

    /// @notice A provider's acceptance of an assignment (EIP-712 `Accept`).
    struct SignedApproval {
        uint256 nonce;
        uint256 deadline;
        bytes signature;
    }

    /// @notice One verifier's signature over a verdict's outcomes (EIP-712 `Verdict`).
    struct VerifierSignature {
        address verifier;
        uint256 deadline;
        bytes signature;
    }

    /// @notice A provider's signed commitment (EIP-712 `UnitCommit`), relayed by {commitBatch}.
    struct SignedCommit {
        address provider;
        bytes32 commitment;
        uint256 deadline;
        bytes signature;
    }

    /// @notice A provider's reveal (the commitment's preimage), relayed by {revealBatch}.
    struct Reveal {
        address provider;
        bytes32 resultDigest;
        bytes32 salt;
    }

    /// @notice Read-only view of a unit.
    struct UnitView {
        uint256 orderId;
        UnitState state;
        uint8 replicas;
        uint8 verifierCount;
        uint8 committedMask;
        uint8 revealedMask;
        bool drawn;
        uint64 commitDeadline;
        uint64 revealDeadline;
        uint64 verdictDeadline;
    }

    /// @dev One slot: everything every unit action reads or writes.
    struct Unit {
        uint64 orderId;
        uint40 commitDeadline;
        uint40 revealDeadline;
        UnitState state;
        uint8 replicas;
        uint8 verifierCount;
        uint8 committedMask;
        uint8 revealedMask;
        bool drawn;
        /// @dev 1 + the index of the commitment page holding replicas 1.. while the unit is open; 0: none.
        uint8 page;
        /// @dev Block of the last commit (0 until every replica committed): its hash draws the spot check
        /// at the first reveal.
        uint48 seedBlock;
        /// @dev A round-path unit set aside for a verdict ({JobMarketRounds}): its providers' collateral is
        /// their roster's (locked once for the order, released by {JobMarketRounds-closeRoster}), so settling
        /// it releases only its verifiers'.
        bool rostered;
    }

    /// @dev One slot per account: its EIP-712 nonce and its party id (0 until first assigned to a unit),
    /// packed so that assigning a provider reads its id from the slot its nonce update touches anyway.
    struct Party {
        uint64 nonce;
        uint24 id;
    }

    /// @dev One slot: the number of units ever assigned and which commitment pages open units hold.
    struct UnitCounter {
        uint128 count;
        uint128 busyPages;
    }

    /// @dev One slot per account: pull-payment credit and reputation counters.
    struct Account {
        uint128 credit;
        uint32 valid;
        uint32 fault;
        uint32 fraud;
        uint32 consecutiveValid;
    }

    /// @notice A round-path order's fixed assignment ({JobMarketRounds}): replica `r` of unit `u` of every
    /// round is worked by `providers[(layout >> 5 * (u * replicas + r)) & 31]`, the providers and layout
    /// being hashed into `partiesHash` (they travel in calldata). Two slots.
    struct Roster {
        bytes32 partiesHash;
        uint8 unitsPerRound; // units x replicas <= 51 slots
        /// @dev Consecutive valid units each provider needs for its units to skip the verdict: the order's
        /// trusted streak when the roster has fewer replicas than the order's most, and the probation streak.
        uint16 requiredStreak;
        uint32 rounds;
        /// @dev Rounds committed so far; every one but a pending one has been revealed and settled.
        uint32 committed;
        /// @dev Block of the step that committed the round not yet revealed (0: none): its hash draws that
        /// round's spot checks.
        uint40 pendingBlock;
        /// @dev When that step was mined: the round may be revealed for `revealWindow` after it, even past
        /// the order's deadline, before anyone may close the roster without paying it.
        uint40 pendingSince;
        uint8 replicas;
        bool closed;
        /// @dev Units set aside for a verdict so far (they settle on the per-unit path, not at close) and
        /// how many of them are not settled yet (the roster cannot close while any is: their providers'
        /// collateral is the roster's).
        uint32 setAsideUnits;
        uint32 openSetAside;
        /// @dev Round audit records no posting covers yet (their chain is in the roster's round hash): the roster
        /// cannot close while there are ({JobMarketRounds-stepRound}).
        bool auditsPending;
        /// @dev Bits [8p, 8p + 8): provider p's fault + fraud count when the roster opened (mod 256). A provider
        /// whose count moved since (a fault or fraud, here or elsewhere) gets no streak for the roster's
        /// slots at close: slots it revealed before a catch must not rebuild the streak the catch ended.
        uint256 faultMarks;
    }

    /// @dev A roster provider's collateral that set-aside units of the roster used before slashing it
    /// ({_unlockProvider}): `held` is its roster lock (one `providerCollateral` per slot), `released` what
    /// slashes released of it, so {JobMarketRounds-closeRoster} releases only the rest. Written only when a
    /// unit is set aside.
    struct RosterLock {
        uint128 held;
        uint128 released;
    }

    /// @dev A roster's verifiers ({JobMarketRounds-openRoster}), who audit its drawn units by `RoundAudit`
    /// signatures. `key` = keccak256(verifiersHash, postedChain):
    /// `verifiersHash` the keccak of their addresses (abi-encoded; they travel in calldata), `postedChain` the
    /// roster's postings chained in order from zero, each `keccak256(abi.encode(previous, info, records))`,
    /// `records` the chain of the round records it covers ({AuditRecord}, chained the same way from zero).
    /// A step that reveals drawn unanimous units appends their round's record to the pending chain, kept in
    /// the roster's round hash (no write of its own); a posting (a quorum's signatures over the pending chain)
    /// chains it into `key`. Zero: a roster without verifiers, whose drawn units are set aside. Written at
    /// open, at each posting and by each challenge: the records travel in
    /// calldata (a step gives the posted chain and the pending one, a challenge the records from a posting's
    /// first on, the close all of them), so each signer's count of audited units (its fee:
    /// `verifierFeePerUnit / verifiers` each, paid at close) and the end of the last posting's challenge
    /// window are computed from them at close. `released` (bit `i`): verifier `i`'s collateral was
    /// released before a slash of its audit ({JobMarketRoundAudits-releaseAuditSigners}), so the close releases it
    /// no more; a second slot, written only by those releases.
    struct RosterAudits {
        bytes32 key;
        uint8 released;
    }

    /// @notice One audit record, as {RoundRevealed} or {AuditPosted} gave it and each {AuditChallenged} since
    /// updated it. A round's: `info` bits 0..63 its drawn unanimous units, 112..175 those challenged since,
    /// 176..207 the round; `digestsHash` the keccak of the round's unit digests ({RoundRevealed}). A posting's: bit 255 set,
    /// 64..71 the signers (roster verifier indexes), 72..111 the posting step's time; its `digestsHash` is not
    /// read (the chain of the round records before it, back to the previous posting, stands in for it).
    struct AuditRecord {
        uint256 info;
        bytes32 digestsHash;
    }

    /// @dev One slot: the two liabilities (solvency: token balance >= escrow + credits).
    struct Totals {
        uint128 escrow;
        uint128 credits;
    }

    /// @notice The payment token.
    IERC20 public immutable token;
    /// @notice The stake registry that holds provider collateral and verifier stake.
    StakeManager public immutable stakes;
    /// @notice keccak256(abi.encode(token, stakes, params)) as constructed: {JobMarket} takes only an
    /// extension whose configuration hashes to its own.
    bytes32 public immutable configHash;

    uint64 internal immutable _commitWindow;
    uint64 internal immutable _revealWindow;
    uint64 internal immutable _verdictWindow;
    uint8 internal immutable _minVerifiers;
    uint16 internal immutable _bountyBps;
    uint256 internal immutable _providerCollateral;
    uint256 internal immutable _slashAmount;
    uint256 internal immutable _verifierCollateral;
    uint32 internal immutable _spotCheckPpm;
    uint32 internal immutable _soloSpotCheckPpm;
    uint256 internal immutable _withholdPenalty;
    uint16 internal immutable _probationStreak;

    uint256 internal _orderCount;
    UnitCounter internal _unitCounter;
    Totals internal _totals;
    mapping(uint256 orderId => Order) internal _orders;
    mapping(uint256 unitId => Unit) internal _units;
    /// @dev A unit's providers then verifiers as 24-bit party ids, party `i` in bits [24i, 24i+24): one
    /// fresh slot per unit instead of one per 1.6 addresses (see {_partyAt}).
    mapping(uint256 unitId => uint256) internal _unitParties;
    /// @dev Holds a replica's commitment until it reveals, then its result digest. Replica 0 always
    /// lives here; replicas 1.. of a unit that holds a commitment page live in the page while the unit
    /// is open and are copied here when a verdict or expiry settles it. A finalized unit keeps only its
    /// unanimous digest, in entry 0 (see {replicaOf}).
    mapping(uint256 unitId => bytes32[MAX_REPLICAS]) internal _digests;
    /// @dev Recycled storage for the commitments of replicas 1.. of open units: a page is taken at
    /// assignment and released at settlement, so in steady state a commitment overwrites a stale value
    /// (5,000 gas) instead of filling a fresh slot (22,100 gas).
    mapping(uint256 page => bytes32[MAX_REPLICAS - 1]) internal _pages;
    mapping(address account => Account) internal _accounts;
    /// @dev Nonces and the party registry: every address gets a permanent id (from 1) when first
    /// assigned to a unit.
    mapping(address account => Party) internal _parties;
    mapping(uint256 partyId => address) internal _partyAddresses;
    uint256 internal _partyCount;
    /// @dev Unordered `Accept` nonces: bit `nonce & 255` of word `nonce >> 8` is set once used.
    mapping(address account => mapping(uint256 word => uint256)) internal _acceptNonces;
    /// @dev The outcomesHash of the verdict that settled a unit, for appeals ({verdictHashOf}). Written only
    /// on the dispute path.
    mapping(uint256 unitId => bytes32) internal _verdictHashes;
    /// @dev A verdicted unit's replicas judged fraud, held until its truth is fixed ({settleHeld}): bits 0..7
    /// the replicas, bits 8..15 the verdict's signers among its verifiers, bits 16.. the verdict's time.
    /// 0: nothing held.
    mapping(uint256 unitId => uint256) internal _held;
    /// @dev Round-path orders ({JobMarketRounds}): the roster, and the chained hash of the round committed
    /// last and not yet revealed.
    mapping(uint256 orderId => Roster) internal _rosters;
    mapping(uint256 orderId => bytes32) internal _roundHashes;
    /// @dev Per roster provider (by index), its replica slots in set-aside units: paid by their verdicts,
    /// so not by the roster.
    mapping(uint256 orderId => mapping(uint256 providerIndex => uint256)) internal _setAsideSlots;
    /// @dev Openings a provider published itself while its round was pending ({JobMarketRounds-publishOpening}),
    /// by `_roundUnitId(orderId, round, slot)` (a slot, not a unit, here): the result digest, checked against
    /// the round's commitments when published. Zero: none.
    mapping(uint256 slotKey => bytes32) internal _publishedOpenings;
    mapping(uint256 orderId => mapping(address provider => RosterLock)) internal _rosterLocks;
    mapping(uint256 orderId => RosterAudits) internal _rosterAudits;
    /// @dev A unit set aside by a challenge of its round audit ({JobMarketRoundAudits-challengeAudit}): the party
    /// ids (24 bits each) of the roster verifiers who signed that audit, their roster indexes as a mask in
    /// bits 232..239 and their number in bits 240..: VerdictAppeals slashes them when the unit's truth has fraud.
    mapping(uint256 unitId => uint256) internal _auditSigners;

    /// @notice A constructor argument is unusable.
    error InvalidParameter(string name);
    /// @notice The order has no units.
    error ZeroUnits();
    /// @notice Replicas must be 1..MAX_REPLICAS.
    error InvalidReplicaCount(uint8 replicas);
    /// @notice An adaptive order needs 1 <= minReplicas <= maxReplicas.
    error InvalidReplicaBounds(uint8 minReplicas, uint8 maxReplicas);
    /// @notice A unit below its order's most replicas takes only providers with `streak` consecutive valid units.
    error ProviderNotTrusted(address provider, uint16 streak);
    /// @notice The order deadline is not in the future.
    error InvalidDeadline(uint64 deadline, uint256 now);
    /// @notice The token moved a different amount than requested (fee-on-transfer tokens are unsupported).
    error TransferAmountMismatch(uint256 expected, uint256 received);
    /// @notice No order has this id.
    error UnknownOrder(uint256 orderId);
    /// @notice The order is closed.
    error OrderNotOpen(uint256 orderId);
    /// @notice The order's deadline has passed; it takes no more assignments.
    error OrderExpired(uint256 orderId, uint64 deadline);
    /// @notice The order has no unit left to assign, or its balance does not cover one.
    error NoUnitBudget(uint256 orderId);
    /// @notice The number of providers (or of their acceptances) differs from the order's replicas.
    error ProviderCountMismatch(uint256 expected, uint256 given);
    /// @notice Verifiers must number between minVerifiers and MAX_VERIFIERS.
    error InvalidVerifierCount(uint256 given, uint256 min, uint256 max);
    /// @notice An address appears twice among a unit's providers and verifiers, or signs a verdict twice.
    error DuplicateParty(address account);
    /// @notice The unit is not in a state that allows this action (`state` is a {UnitState}).
    error InvalidUnitState(uint256 unitId, uint8 state);
    /// @notice The unit was already finalized, verdicted or expired.
    error UnitAlreadySettled(uint256 unitId);
    /// @notice `account` is not one of the unit's providers.
    error NotAssignedProvider(uint256 unitId, address account);
    /// @notice `account` is not one of the unit's verifiers.
    error NotAssignedVerifier(uint256 unitId, address account);
    /// @notice The commit phase ended at `deadline`.
    error CommitWindowClosed(uint256 unitId, uint64 deadline);
    /// @notice The provider already committed.
    error AlreadyCommitted(uint256 unitId, address provider);
    /// @notice Reveals open once every replica committed or after `commitDeadline`.
    error RevealWindowNotOpen(uint256 unitId, uint64 commitDeadline);
    /// @notice Reveals open in the block after the last commit (`seedBlock`), whose hash draws the spot check.
    error RevealTooEarly(uint256 unitId, uint256 seedBlock);
    /// @notice The reveal phase ended at `deadline`.
    error RevealWindowClosed(uint256 unitId, uint64 deadline);
    /// @notice The provider never committed, so there is nothing to reveal.
    error NotCommitted(uint256 unitId, address provider);
    /// @notice The provider already revealed.
    error AlreadyRevealed(uint256 unitId, address provider);
    /// @notice The revealed digest and salt do not hash to the provider's commitment.
    error RevealMismatch(uint256 unitId, address provider);
    /// @notice Not every replica revealed yet.
    error RevealsIncomplete(uint256 unitId);
    /// @notice The revealed digests differ: the unit needs a verdict.
    error NotUnanimous(uint256 unitId);
    /// @notice The unit was drawn for a spot check: it settles by verdict (or expiry) only.
    error UnitUnderVerification(uint256 unitId);
    /// @notice Until the verdict deadline only the operator finalizes: it first checks the reveals against
    /// known answers (canaries) and asks for verification when one misses.
    error FinalizeReserved(uint256 unitId, uint64 verdictDeadline);
    /// @notice Every replica revealed one digest and the unit was not drawn: it is finalized, not expired.
    error UnitFinalizable(uint256 unitId);
    /// @notice Verdicts open once every replica revealed or after `revealDeadline`.
    error VerdictWindowNotOpen(uint256 unitId, uint64 revealDeadline);
    /// @notice The verdict phase ended at `deadline`.
    error VerdictWindowClosed(uint256 unitId, uint64 deadline);
    /// @notice A verdict needs one outcome per replica.
    error OutcomeCountMismatch(uint256 expected, uint256 given);
    /// @notice The outcomes given as the unit's verdict are not the ones that settled it ({verdictHashOf}).
    error VerdictMismatch(uint256 unitId);
    /// @notice Outcome at `index` is unknown, or accept/fraud for a replica that never revealed.
    error InvalidOutcome(uint256 index, uint8 outcome);
    /// @notice Fewer than a majority of the unit's assigned verifiers signed.
    error QuorumNotReached(uint256 unitId, uint256 valid, uint256 required);
    /// @notice The unit can expire only after its verdict deadline.
    error UnitNotExpired(uint256 unitId, uint64 verdictDeadline);
    /// @notice Only the buyer may close the order before its deadline.
    error OrderNotClosable(uint256 orderId, uint64 deadline);
    /// @notice Units of the order are still open; settle or expire them first.
    error UnitsStillOpen(uint256 orderId, uint256 open);
    /// @notice The account has no credit.
    error NothingToWithdraw(address account);
    /// @notice Replica index out of range for the unit.
    error ReplicaIndexOutOfRange(uint256 unitId, uint256 index);
    /// @notice The provider already used this unordered `Accept` nonce.
    error AcceptNonceUsed(address provider, uint256 nonce);
    /// @notice A batch call got no entries.
    error EmptyBatch();
    /// @notice All 2**24 - 1 party ids are taken; no new address can be assigned to a unit.
    error PartyRegistryFull();
    /// @notice The order already has a roster.
    error RosterExists(uint256 orderId);
    /// @notice The order has no roster, or its roster is closed.
    error RosterNotOpen(uint256 orderId);
    /// @notice A roster's layout names a provider index that is out of range, twice in one unit, or never, or
    /// has more replica slots than its 5-bit fields can hold.
    error InvalidLayout(uint256 slot);
    /// @notice The providers and layout given are not the roster's.
    error RosterMismatch(uint256 orderId);
    /// @notice A step's openings or works do not cover every replica slot of a round.
    error EntryCountMismatch(uint256 expected, uint256 given);
    /// @notice The roster has committed all its rounds, or a round was to be revealed and was not.
    error NoRoundToStep(uint256 orderId, uint32 committed);
    /// @notice The round's openings do not hash to its recorded commitments.
    error RoundHashMismatch(uint256 orderId, uint32 round);
    /// @notice Reveals of a round are refused in the block that committed it (its hash draws the checks).
    error RoundRevealTooEarly(uint256 orderId, uint256 seedBlock);
    /// @notice A unit of the round needs a verdict (drawn, or its replicas disagree) and the step came
    /// without verifiers for it, or not from the operator (only the operator picks verifiers).
    error RoundUnitNeedsVerdict(uint256 orderId, uint32 round, uint256 unit, bool drawn);
    /// @notice A round's slots may be given as withheld only once its reveal window has passed.
    error RoundRevealWindowOpen(uint256 orderId, uint64 until);
    /// @notice The roster still has rounds to settle until `closableAfter` (the order's deadline, or the end
    /// of a pending round's reveal window, or of an audited round's challenge window, when later).
    error RosterNotClosable(uint256 orderId, uint64 closableAfter);
    /// @notice The roster's verifiers given are not its own (or it has none).
    error AuditorsMismatch(uint256 orderId);
    /// @notice The round's audit record given does not match the one stored (or the round was not audited).
    error AuditMismatch(uint256 orderId, uint256 round);
    /// @notice The unit was not paid by the round's audit, or was already challenged.
    error NotAudited(uint256 orderId, uint256 round, uint256 unit);
    /// @notice Challenges of the round's audit closed at `until` (the step's time plus `verdictWindow`).
    error AuditChallengeClosed(uint256 orderId, uint256 round, uint64 until);
    /// @notice The roster has round audit records no posting covers yet: nothing closes it before one does.
    error AuditsPending(uint256 orderId);

    /// @notice A buyer posted an order and escrowed `escrow` tokens.
    event OrderPosted(
        uint256 indexed orderId,
        address indexed buyer,
        bytes32 specHash,
        uint32 units,
        uint8 replicas,
        uint256 pricePerReplica,
        uint256 verifierFeePerUnit,
        uint64 deadline,
        uint256 escrow
    );
    /// @notice A unit of an order was assigned; its commit phase ends at `commitDeadline`.
    event UnitAssigned(
        uint256 indexed unitId,
        uint256 indexed orderId,
        bytes32 unitKey,
        address[] providers,
        address[] verifiers,
        uint64 commitDeadline
    );
    /// @notice A replica committed to its result.
    event ReplicaCommitted(uint256 indexed unitId, address indexed provider, bytes32 commitment);
    /// @notice A replica revealed its result digest.
    event ReplicaRevealed(uint256 indexed unitId, address indexed provider, bytes32 resultDigest);
    /// @notice The unit was drawn for a verifier spot check (by the on-chain draw or by the operator).
    event VerificationRequested(uint256 indexed unitId);
    /// @notice A replica committed but did not reveal by the reveal deadline and lost `amount` of stake.
    event RevealWithheld(uint256 indexed unitId, address indexed provider, uint256 amount);
    /// @notice All replicas agreed on `resultDigest`; every replica was paid.
    event UnitFinalized(uint256 indexed unitId, bytes32 resultDigest);
    /// @notice A majority of the unit's verifiers settled it with one outcome per replica (`verifiers`: the
    /// signers, who share the fee).
    event VerdictRecorded(uint256 indexed unitId, uint8[] outcomes, bytes32 outcomesHash, address[] verifiers);
    /// @notice A replica judged fraudulent lost `amount` of stake.
    event ReplicaSlashed(uint256 indexed unitId, address indexed provider, uint256 amount);
    /// @notice The verdict called the replicas in `replicaMask` fraud: their collateral and price are held
    /// until the unit's truth is fixed ({settleHeld}).
    event FraudHeld(uint256 indexed unitId, uint8 replicaMask);
    /// @notice The held replicas were settled by the unit's truth (one outcome per replica, as a verdict).
    event HeldSettled(uint256 indexed unitId, uint8[] truth);
    /// @notice Nobody settled the unit in time; its budget returned to the order.
    event UnitExpired(uint256 indexed unitId);
    /// @notice The order was closed and `refund` credited to its buyer.
    event OrderClosed(uint256 indexed orderId, uint256 refund);
    /// @notice `account` withdrew `amount` of credit.
    event CreditWithdrawn(address indexed account, uint256 amount);
    /// @notice A close could not pay `account` its `amount` (the token refused the transfer): it stays its
    /// credit, for {withdrawCredit}.
    event CreditKept(address indexed account, uint256 amount);
    /// @notice A round-path order's roster was fixed: `rounds` rounds of `unitsPerRound` units, `replicas`
    /// each, replica slot `i` worked by `providers[(layout >> 5 * i) & 31]`.
    event RosterOpened(
        uint256 indexed orderId, address[] providers, uint256 layout, uint8 replicas, uint32 unitsPerRound, uint32 rounds
    );
    /// @notice Every replica of every unit of `round` committed (one signature each, checked on chain).
    event RoundCommitted(uint256 indexed orderId, uint32 indexed round);
    /// @notice `round` was revealed. `digests[unit]` is the unit's result when the unit was not set aside
    /// (unanimous, not drawn: its replicas are paid when the roster closes); for a unit set aside
    /// ({UnitSetAside}) it is only replica 0's value (a digest, or its commitment when it did not open).
    /// `audited`: the drawn unanimous units left pending a posting (bit `u` for unit `u`; zero: none), whose
    /// round record ({AuditRecord}) is `(audited | round << 176, keccak256(abi.encodePacked(digests)))`.
    event RoundRevealed(uint256 indexed orderId, uint32 indexed round, bytes32[] digests, uint256 audited);
    /// @notice Unit `unit` of `round` needed a verdict (drawn, its replicas disagree, or a provider's streak
    /// fell below the roster's requirement): it became unit `unitId`, revealed and drawn, with the step's
    /// verifiers, and settles on the per-unit path ({submitVerdict}, {expireUnit}).
    event UnitSetAside(uint256 indexed orderId, uint32 indexed round, uint256 unit, uint256 unitId);
    /// @notice The provider of replica slot `slot` of the pending `round` published its opening itself.
    event OpeningPublished(uint256 indexed orderId, uint32 indexed round, uint256 slot, bytes32 resultDigest);
    /// @notice The roster closed: `settledRounds` rounds paid, `paid` credited to its providers.
    event RosterClosed(uint256 indexed orderId, uint32 settledRounds, uint256 paid);
    /// @notice The roster's verifiers, each locking `verifierCollateral` for the order.
    event RosterVerifiers(uint256 indexed orderId, address[] verifiers);
    /// @notice A quorum of the roster's verifiers signed `RoundAudit(orderId, records)`, `records` the chain of
    /// the round records pending before this posting ({RoundRevealed}'s `audited`): their units are paid at
    /// close. `info` is the posting's {AuditRecord} (bit 255, the signers at 64..71, the step's time at 72..111).
    event AuditPosted(uint256 indexed orderId, uint256 info, bytes32 records);
    /// @notice The operator challenged unit `unit` of an audited round: it was set aside as `unitId`
    /// ({UnitSetAside}), and its audit's signers answer for its truth. `info`: the round's audit record now.
    event AuditChallenged(uint256 indexed orderId, uint32 indexed round, uint256 unit, uint256 unitId, uint256 info);
    /// @notice The last `records` pending round records were taken off the roster's pending chain
    /// ({JobMarketRoundAudits-setAsidePending}): their units set aside ({UnitSetAside}), or dropped unpaid.
    event PendingSetAside(uint256 indexed orderId, uint256 records);

    /// @param token_ Payment token (must equal the stake manager's token).
    /// @param stakes_ Stake registry (it grants {JobMarket} its MARKET_ROLE after deployment).
    /// @param params_ Market parameters (0 < windows <= MAX_WINDOW, 1 <= minVerifiers <= MAX_VERIFIERS,
    /// slash <= collateral, bounty <= 100 %, verifierCollateral > 0,
    /// spot-check rates <= 1e6 ppm, withholdPenalty <= slashAmount).
    constructor(IERC20 token_, StakeManager stakes_, Params memory params_)
        TypedSignatures("Veritrain JobMarket", "1")
    {
        if (address(token_) == address(0) || address(stakes_.token()) != address(token_)) {
            revert InvalidParameter("token");
        }
        if (params_.commitWindow == 0 || params_.commitWindow > MAX_WINDOW) revert InvalidParameter("commitWindow");
        if (params_.revealWindow == 0 || params_.revealWindow > MAX_WINDOW) revert InvalidParameter("revealWindow");
        if (params_.verdictWindow == 0 || params_.verdictWindow > MAX_WINDOW) {
            revert InvalidParameter("verdictWindow");
        }
        if (params_.minVerifiers == 0 || params_.minVerifiers > MAX_VERIFIERS) {
            revert InvalidParameter("minVerifiers");
        }
        if (params_.bountyBps > BPS) revert InvalidParameter("bountyBps");
        if (params_.slashAmount > params_.providerCollateral) revert InvalidParameter("slashAmount");
        if (params_.verifierCollateral == 0) revert InvalidParameter("verifierCollateral");
        if (params_.spotCheckPpm > PPM || params_.soloSpotCheckPpm > PPM) revert InvalidParameter("spotCheckPpm");
        if (params_.withholdPenalty > params_.slashAmount) revert InvalidParameter("withholdPenalty");
        token = token_;
        stakes = stakes_;
        configHash = keccak256(abi.encode(token_, stakes_, params_));
        _commitWindow = params_.commitWindow;
        _revealWindow = params_.revealWindow;
        _verdictWindow = params_.verdictWindow;
        _minVerifiers = params_.minVerifiers;
        _bountyBps = params_.bountyBps;
        _providerCollateral = params_.providerCollateral;
        _slashAmount = params_.slashAmount;
        _verifierCollateral = params_.verifierCollateral;
        _spotCheckPpm = params_.spotCheckPpm;
        _soloSpotCheckPpm = params_.soloSpotCheckPpm;
        _withholdPenalty = params_.withholdPenalty;
        _probationStreak = params_.probationStreak;
    }

    /// @dev See {JobMarket-commitmentOf}. keccak256(abi.encode(...)) hashed where free memory starts,
    /// without allocating: the round path computes one per replica slot.
    function _commitmentOf(bytes32 resultDigest, bytes32 salt, address provider, uint256 unitId)
        internal
        pure
        returns (bytes32 commitment)
    {
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            mstore(ptr, resultDigest)
            mstore(add(ptr, 0x20), salt)
            mstore(add(ptr, 0x40), and(provider, 0xffffffffffffffffffffffffffffffffffffffff))
            mstore(add(ptr, 0x60), unitId)
            commitment := keccak256(ptr, 0x80)
        }
    }

    /// @dev See {JobMarket-rosterKey}.
    function _rosterKey(
        address[] calldata providers,
        uint256 layout,
        uint8 replicas,
        uint32 unitsPerRound,
        uint32 rounds
    ) internal pure returns (bytes32) {
        return keccak256(abi.encode(providers, layout, replicas, unitsPerRound, rounds));
    }

    /// @dev See {JobMarket-rosterKey}: a roster with verifiers binds them too; one without keeps its parties' key.
    function _acceptKey(bytes32 partiesKey, address[] calldata verifiers) internal pure returns (bytes32) {
        return verifiers.length == 0 ? partiesKey : keccak256(abi.encode(partiesKey, verifiers));
    }

    /// @dev See {JobMarket-roundUnitId}. keccak256(abi.encode(...)) without allocating, as {_commitmentOf}.
    function _roundUnitId(uint256 orderId, uint256 round, uint256 unit) internal pure returns (uint256 id) {
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            mstore(ptr, orderId)
            mstore(add(ptr, 0x20), round)
            mstore(add(ptr, 0x40), unit)
            id := keccak256(ptr, 0x60)
        }
    }

    /// @inheritdoc TypedSignatures
    function nonces(address account) public view override returns (uint256) {
        return _parties[account].nonce;
    }

    // ----------------------------------------------------------------------------------------------
    // Internals
    // ----------------------------------------------------------------------------------------------

    /// @dev Records an order (escrow for `replicas` per unit) and pulls its escrow from the caller.
    function _postOrder(
        bytes32 specHash,
        uint32 units,
        uint8 minReplicas,
        uint8 replicas,
        uint16 trustedStreak,
        uint256 pricePerReplica,
        uint256 verifierFeePerUnit,
        uint64 deadline
    ) internal returns (uint256 orderId) {
        if (units == 0) revert ZeroUnits();
        if (replicas == 0 || replicas > MAX_REPLICAS) revert InvalidReplicaCount(replicas);
        if (deadline <= block.timestamp) revert InvalidDeadline(deadline, block.timestamp);
        uint256 escrow = uint256(units) * (uint256(replicas) * pricePerReplica + verifierFeePerUnit);
        uint128 escrow128 = SafeCast.toUint128(escrow);
        orderId = ++_orderCount;
        _orders[orderId] = Order({
            buyer: msg.sender,
            deadline: deadline,
            units: units,
            pricePerReplica: uint128(pricePerReplica), // <= escrow
            verifierFeePerUnit: uint128(verifierFeePerUnit), // <= escrow
            balance: escrow128,
            delivered: 0,
            openUnits: 0,
            replicas: replicas,
            closed: false,
            minReplicas: minReplicas,
            trustedStreak: trustedStreak
        });
        _totals.escrow += escrow128;
        emit OrderPosted(
            orderId, msg.sender, specHash, units, replicas, pricePerReplica, verifierFeePerUnit, deadline, escrow
        );
        uint256 balanceBefore = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), escrow);
        uint256 received = token.balanceOf(address(this)) - balanceBefore;
        if (received != escrow) revert TransferAmountMismatch(escrow, received);
    }

    /// @dev Checks the order can take one more unit with these party counts and moves one unit's cost
    /// (its own replica count's) from the order's balance into the open unit. Returns the streak each
    /// provider needs: the order's `trustedStreak` for a unit below its most replicas, else 0.
    function _reserveUnitBudget(uint256 orderId, uint256 providerCount, uint256 acceptCount, uint256 verifierCount)
        internal
        returns (uint8 replicas, uint16 trustedStreak)
    {
        Order storage order = _orders[orderId];
        if (order.buyer == address(0)) revert UnknownOrder(orderId);
        if (order.closed) revert OrderNotOpen(orderId);
        if (block.timestamp > order.deadline) revert OrderExpired(orderId, order.deadline);
        uint8 maxReplicas = order.replicas;
        if (providerCount < order.minReplicas || providerCount > maxReplicas) {
            revert ProviderCountMismatch(maxReplicas, providerCount);
        }
        if (acceptCount != providerCount) revert ProviderCountMismatch(providerCount, acceptCount);
        replicas = uint8(providerCount);
        trustedStreak = providerCount < maxReplicas ? order.trustedStreak : 0;
        _checkVerifierCount(verifierCount);
        uint32 openUnits = order.openUnits;
        if (order.delivered + openUnits >= order.units) revert NoUnitBudget(orderId);
        uint128 unitCost = order.pricePerReplica * replicas + order.verifierFeePerUnit;
        uint128 balance = order.balance;
        if (unitCost > balance) revert NoUnitBudget(orderId);
        order.balance = balance - unitCost;
        order.openUnits = openUnits + 1;
    }

    /// @dev Checks `provider`'s `Accept` signature (consuming its unordered nonce).
    function _acceptProvider(uint256 orderId, bytes32 unitKey, address provider, SignedApproval calldata accept)
        internal
    {
        uint256 nonce = accept.nonce;
        mapping(uint256 => uint256) storage words = _acceptNonces[provider];
        uint256 word = words[nonce >> 8];
        uint256 bit = 1 << (nonce & 0xff);
        if (word & bit != 0) revert AcceptNonceUsed(provider, nonce);
        words[nonce >> 8] = word | bit;
        _checkSignature(
            provider,
            keccak256(abi.encode(ACCEPT_TYPEHASH, orderId, unitKey, provider, accept.nonce, accept.deadline)),
            accept.deadline,
            accept.signature
        );
    }

    /// @dev Reverts {InvalidVerifierCount} unless `minVerifiers <= count <= MAX_VERIFIERS`.
    function _checkVerifierCount(uint256 count) internal view {
        if (count < _minVerifiers || count > MAX_VERIFIERS) revert InvalidVerifierCount(count, _minVerifiers, MAX_VERIFIERS);
    }

    /// @dev Checks the unit's verifiers are distinct from each other and from the providers (their stake is
    /// checked by locking it). Returns their party ids at their positions after the providers'.
    function _checkVerifiers(address[] calldata providers, address[] calldata verifiers)
        internal
        returns (uint256 partyIds)
    {
        for (uint256 i; i < verifiers.length; ++i) {
            address verifier = verifiers[i];
            for (uint256 j; j < providers.length; ++j) {
                if (providers[j] == verifier) revert DuplicateParty(verifier);
            }
            for (uint256 j; j < i; ++j) {
                if (verifiers[j] == verifier) revert DuplicateParty(verifier);
            }
            partyIds |= _partyIdOf(verifier) << ((providers.length + i) * PARTY_ID_BITS);
        }
    }

    /// @dev Counts a new unit and, if it has replicas beyond the first and a page is free, gives it the
    /// lowest free commitment page (as 1 + index; 0 when none).
    function _newUnit(uint8 replicas) internal returns (uint256 unitId, uint8 page) {
        UnitCounter memory counter = _unitCounter;
        unitId = counter.count + 1;
        counter.count = uint128(unitId);
        uint256 busy = counter.busyPages;
        if (replicas > 1 && busy != (1 << COMMIT_PAGES) - 1) {
            uint256 index;
            while (busy & (1 << index) != 0) ++index;
            counter.busyPages = uint128(busy | (1 << index));
            page = uint8(index + 1);
        }
        _unitCounter = counter;
    }

    function _releasePage(uint8 page) internal {
        if (page != 0) _unitCounter.busyPages &= ~uint128(1 << (page - 1));
    }

    /// @dev Copies a settling unit's paged commitments and digests into its own storage, where
    /// {replicaOf} reads them from now on, and releases the page.
    function _unpage(uint256 unitId, Unit memory u) internal {
        if (u.page == 0) return;
        bytes32[MAX_REPLICAS - 1] storage paged = _pages[u.page - 1];
        for (uint256 i = 1; i < u.replicas; ++i) {
            if (u.committedMask & (1 << i) != 0) _digests[unitId][i] = paged[i - 1];
        }
        _releasePage(u.page);
    }

    /// @dev Replica `index`'s commitment or digest of an open unit.
    function _loadReplica(uint256 unitId, uint8 page, uint256 index) internal view returns (bytes32) {
        return index == 0 || page == 0 ? _digests[unitId][index] : _pages[page - 1][index - 1];
    }

    function _storeReplica(uint256 unitId, uint8 page, uint256 index, bytes32 value) internal {
        if (index == 0 || page == 0) _digests[unitId][index] = value;
        else _pages[page - 1][index - 1] = value;
    }

    /// @dev The party id of `account`, registering it on first use (ids start at 1, so 0 means none).
    function _partyIdOf(address account) internal returns (uint256 id) {
        Party storage party = _parties[account];
        id = party.id;
        if (id == 0) {
            id = ++_partyCount;
            if (id > PARTY_ID_MASK) revert PartyRegistryFull();
            party.id = uint24(id);
            _partyAddresses[id] = account;
        }
    }

    /// @dev The party id at position `index` of a unit's packed party ids.
    function _idAt(uint256 partyIds, uint256 index) internal pure returns (uint256) {
        return (partyIds >> (index * PARTY_ID_BITS)) & PARTY_ID_MASK;
    }

    /// @dev Party `index` of the unit: providers are 0..replicas-1, verifiers follow.
    function _partyAt(uint256 unitId, uint256 index) internal view returns (address) {
        return _partyAddresses[_idAt(_unitParties[unitId], index)];
    }

    /// @dev Position of `account` among the unit's parties `from` .. `from + count - 1` (the providers
    /// when `from` is 0, else the verifiers).
    function _indexOf(uint256 unitId, uint256 from, uint256 count, address account) internal view returns (uint256) {
        uint256 id = _parties[account].id;
        if (id != 0) {
            uint256 partyIds = _unitParties[unitId];
            for (uint256 i; i < count; ++i) {
                if (_idAt(partyIds, from + i) == id) return i;
            }
        }
        if (from == 0) revert NotAssignedProvider(unitId, account);
        revert NotAssignedVerifier(unitId, account);
    }

    function _commit(uint256 unitId, address provider, bytes32 commitment) internal {
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _requireOpen(unitId, u.state);
        if (block.timestamp > u.commitDeadline) revert CommitWindowClosed(unitId, u.commitDeadline);
        uint256 index = _indexOf(unitId, 0, u.replicas, provider);
        uint8 bit = uint8(1 << index);
        if (u.committedMask & bit != 0) revert AlreadyCommitted(unitId, provider);
        _storeReplica(unitId, u.page, index, commitment);
        uint8 committedMask = u.committedMask | bit;
        unit.committedMask = committedMask;
        if (committedMask == _fullMask(u.replicas)) {
            unit.state = UnitState.Revealing;
            unit.seedBlock = uint48(block.number);
        }
        emit ReplicaCommitted(unitId, provider, commitment);
    }

    /// @dev Reveals open once every replica committed or after the commit deadline, and close at the
    /// reveal deadline.
    function _checkRevealWindow(uint256 unitId, Unit memory u) internal view {
        _requireOpen(unitId, u.state);
        if (u.state == UnitState.Committing && block.timestamp <= u.commitDeadline) {
            revert RevealWindowNotOpen(unitId, u.commitDeadline);
        }
        if (block.timestamp > u.revealDeadline) revert RevealWindowClosed(unitId, u.revealDeadline);
    }

    /// @dev Fixes the spot-check draw of a fully committed unit at its first reveal (no-op afterwards, or
    /// for a unit that never fully committed: it cannot be finalized anyway). Reverts in the seed block itself, whose hash
    /// no transaction inside it can read: so the draw is unknown to the last committer and fixed before any
    /// reveal is visible. When the seed block is more than 256 blocks old its hash is gone and the unit
    /// counts as drawn: otherwise a revealer could wait for the hash to expire to escape the check.
    function _decideDraw(uint256 unitId, Unit storage unit, Unit memory u) internal {
        uint256 seedBlock = u.seedBlock;
        if (seedBlock == 0 || u.revealedMask != 0) return;
        if (block.number <= seedBlock) revert RevealTooEarly(unitId, seedBlock);
        if (!u.drawn && _drawnBy(unitId, u.replicas, blockhash(seedBlock))) {
            u.drawn = true;
            unit.drawn = true;
            emit VerificationRequested(unitId);
        }
    }

    /// @dev The spot-check draw for seed hash `seed` (zero when it is no longer available: drawn).
    function _drawnBy(uint256 unitId, uint8 replicas, bytes32 seed) internal view returns (bool) {
        uint256 rate = replicas == 1 ? _soloSpotCheckPpm : _spotCheckPpm;
        uint256 draw;
        assembly ("memory-safe") {
            // keccak256(abi.encode(seed, unitId)) in scratch space, without allocating memory
            mstore(0x00, seed)
            mstore(0x20, unitId)
            draw := keccak256(0x00, 0x40)
        }
        return seed == 0 || draw % PPM < rate;
    }

    /// @dev Checks `provider` committed to `resultDigest` and `salt` and has not revealed yet (per
    /// `u.revealedMask`), emits {ReplicaRevealed} and returns the provider's replica index. Stores
    /// nothing: the caller records the digest and the revealed bit.
    function _checkReveal(uint256 unitId, Unit memory u, address provider, bytes32 resultDigest, bytes32 salt)
        internal
        returns (uint256 index)
    {
        index = _indexOf(unitId, 0, u.replicas, provider);
        uint8 bit = uint8(1 << index);
        if (u.committedMask & bit == 0) revert NotCommitted(unitId, provider);
        if (u.revealedMask & bit != 0) revert AlreadyRevealed(unitId, provider);
        if (_commitmentOf(resultDigest, salt, provider, unitId) != _loadReplica(unitId, u.page, index)) {
            revert RevealMismatch(unitId, provider);
        }
        emit ReplicaRevealed(unitId, provider, resultDigest);
    }

    /// @dev Settles a unanimous unit: pays every replica, releases collateral, returns the verifier fee
    /// to the order. `providers[i]` is replica i's provider when the caller already knows it, else zero.
    function _finalize(
        uint256 unitId,
        Unit storage unit,
        Unit memory u,
        bytes32 digest,
        address[MAX_REPLICAS] memory providers
    ) internal {
        unit.state = UnitState.Finalized;
        _releasePage(u.page);
        uint8 replicas = u.replicas;
        Order storage order = _orders[u.orderId];
        uint128 price = order.pricePerReplica;
        address[] memory paid = new address[](replicas);
        for (uint256 i; i < replicas; ++i) {
            address provider = providers[i] == address(0) ? _partyAt(unitId, i) : providers[i];
            _payAccepted(provider, price);
            paid[i] = provider;
        }
        stakes.unlockBatch(paid, _providerCollateral);
        _releaseVerifiers(unitId, u);
        order.balance += order.verifierFeePerUnit;
        order.delivered += 1;
        order.openUnits -= 1;
        uint128 payout = price * replicas;
        Totals memory totals = _totals;
        totals.escrow -= payout;
        totals.credits += payout;
        _totals = totals;
        emit UnitFinalized(unitId, digest);
    }

    /// @dev The end of a unit's verdict window: its reveal deadline (fixed at assignment) plus the
    /// deployment's verdict window. Finalize by anyone but the operator, expiry and verdicts all turn on it.
    function _verdictDeadline(Unit memory u) internal view returns (uint64) {
        return uint64(u.revealDeadline) + _verdictWindow;
    }

    /// @dev Verdicts open once all replicas revealed or after the reveal deadline, and close at the
    /// verdict deadline.
    function _checkVerdictWindow(uint256 unitId, Unit memory u) internal view {
        if (u.revealedMask != _fullMask(u.replicas) && block.timestamp <= u.revealDeadline) {
            revert VerdictWindowNotOpen(unitId, u.revealDeadline);
        }
        uint64 verdictDeadline = _verdictDeadline(u);
        if (block.timestamp > verdictDeadline) revert VerdictWindowClosed(unitId, verdictDeadline);
    }

    /// @dev Checks one known outcome per replica (accept and fraud only for revealed replicas). (The signed
    /// `outcomesHash` is keccak256(abi.encodePacked(outcomes)): one 32-byte word per outcome.)
    function _checkOutcomes(Unit memory u, uint8[] calldata outcomes) internal pure {
        if (outcomes.length != u.replicas) revert OutcomeCountMismatch(u.replicas, outcomes.length);
        for (uint256 i; i < outcomes.length; ++i) {
            uint8 outcome = outcomes[i];
            bool revealed = u.revealedMask & (1 << i) != 0;
            if (outcome > OUTCOME_FRAUD || (outcome != OUTCOME_FAULT && !revealed)) {
                revert InvalidOutcome(i, outcome);
            }
        }
    }

    /// @dev The replicas `outcomes` judge fraud, as a bit mask.
    function _fraudMask(uint8[] calldata outcomes) internal pure returns (uint256 mask) {
        for (uint256 i; i < outcomes.length; ++i) {
            if (outcomes[i] == OUTCOME_FRAUD) mask |= 1 << i;
        }
    }

    /// @dev Checks every signature is a distinct assigned verifier's valid `Verdict` signature and that
    /// they are a majority of the unit's verifiers. Returns the signers and their positions as a bit mask.
    function _checkVerdictSignatures(
        uint256 unitId,
        uint8 replicas,
        uint8 verifierCount,
        bytes32 outcomesHash,
        VerifierSignature[] calldata signatures
    ) internal view returns (address[] memory signers, uint256 seen) {
        signers = new address[](signatures.length);
        for (uint256 s; s < signatures.length; ++s) {
            VerifierSignature calldata sig = signatures[s];
            uint256 bit = 1 << _indexOf(unitId, replicas, verifierCount, sig.verifier);
            if (seen & bit != 0) revert DuplicateParty(sig.verifier);
            seen |= bit;
            _checkSignature(
                sig.verifier,
                keccak256(abi.encode(VERDICT_TYPEHASH, unitId, outcomesHash, sig.deadline)),
                sig.deadline,
                sig.signature
            );
            signers[s] = sig.verifier;
        }
        uint256 quorum = uint256(verifierCount) / 2 + 1;
        if (signatures.length < quorum) revert QuorumNotReached(unitId, signatures.length, quorum);
    }

    /// @dev Releases the collateral of every verifier assigned to the settling unit.
    function _releaseVerifiers(uint256 unitId, Unit memory u) internal {
        stakes.unlockBatch(_verifiersAt(unitId, u, type(uint256).max), _verifierCollateral);
    }

    /// @dev Moves a verdicted unit's money: replica payouts and withhold penalties, the verifiers' fee and
    /// the penalties' bounty, the buyer's share of penalties, and unpaid prices back to the order. Replicas
    /// judged fraud are held (price in escrow, collateral locked) for {settleHeld}.
    function _settleVerdict(
        uint256 unitId,
        Unit memory u,
        uint8[] calldata outcomes,
        address[] memory signers,
        uint256 held
    ) internal {
        Order storage order = _orders[u.orderId];
        uint128 price = order.pricePerReplica;
        uint128 fee = order.verifierFeePerUnit;
        (uint256 paidCount, uint256 penalties) = _applyOutcomes(unitId, u, outcomes, type(uint256).max, address(0));
        if (held != 0) {
            _held[unitId] = held;
            emit FraudHeld(unitId, uint8(held));
        }
        uint256 verifierPay = _payEach(signers, fee + (penalties * _bountyBps) / BPS);
        uint256 toBuyer = penalties + fee - verifierPay;
        if (toBuyer != 0) _accounts[order.buyer].credit += SafeCast.toUint128(toBuyer);

        uint256 paid = paidCount * price;
        order.balance += uint128((u.replicas - paidCount - _countBits(held & 0xff)) * price);
        if (paidCount != 0) order.delivered += 1;
        order.openUnits -= 1;
        Totals memory totals = _totals;
        totals.escrow -= uint128(paid + fee);
        totals.credits += SafeCast.toUint128(paid + fee + penalties);
        _totals = totals;
    }

    /// @dev Applies `outcomes` to the replicas in `mask`: accept is paid and released, fault released (a
    /// replica that committed and never revealed also loses the withhold penalty, shared like
    /// a slash: the verdict window opens for it only after the reveal deadline), fraud released and slashed
    /// to `slashTo`, or, when `slashTo` is zero (at the verdict), held: its collateral stays locked, its
    /// fraud is counted and its streak ends at once (so matching and reduced units see the accusation
    /// meanwhile); settling a held replica (`slashTo` set) that the truth acquits takes the count back.
    /// Returns how many were paid and the stake received.
    function _applyOutcomes(
        uint256 unitId,
        Unit memory u,
        uint8[] calldata outcomes,
        uint256 mask,
        address slashTo
    ) internal returns (uint256 paidCount, uint256 slashed) {
        uint128 price = _orders[u.orderId].pricePerReplica;
        for (uint256 i; i < outcomes.length; ++i) {
            if (mask & (1 << i) == 0) continue;
            address provider = _partyAt(unitId, i);
            uint8 outcome = outcomes[i];
            if (outcome == OUTCOME_FRAUD && slashTo == address(0)) {
                _recordFraud(provider);
                continue;
            }
            bool withheld = (u.committedMask & ~u.revealedMask) & (1 << i) != 0;
            _unlockProvider(u, provider, outcome == OUTCOME_FRAUD || (outcome == OUTCOME_FAULT && withheld));
            if (slashTo != address(0) && outcome != OUTCOME_FRAUD) _accounts[provider].fraud -= 1; // acquitted
            if (outcome == OUTCOME_ACCEPT) {
                _payAccepted(provider, price);
                ++paidCount;
            } else if (outcome == OUTCOME_FAULT) {
                _recordFault(provider);
                if (withheld) slashed += _penalizeWithholding(unitId, provider);
            } else {
                _accounts[provider].consecutiveValid = 0; // confirmed: a streak since the accusation ends too
                uint256 taken = stakes.slash(provider, _slashAmount, slashTo);
                slashed += taken;
                emit ReplicaSlashed(unitId, provider, taken);
            }
        }
    }

    /// @dev Credits `amount` split evenly among `accounts`; returns what was credited (the rounding dust
    /// is the caller's to place).
    function _payEach(address[] memory accounts, uint256 amount) internal returns (uint256 credited) {
        uint256 share = amount / accounts.length;
        for (uint256 i; i < accounts.length; ++i) {
            _accounts[accounts[i]].credit += SafeCast.toUint128(share);
        }
        return share * accounts.length;
    }

    /// @dev The unit's verifiers at the positions set in `mask`, in assignment order.
    function _verifiersAt(uint256 unitId, Unit memory u, uint256 mask) internal view returns (address[] memory found) {
        found = new address[](u.verifierCount);
        uint256 partyIds = _unitParties[unitId];
        uint256 count;
        for (uint256 i; i < u.verifierCount; ++i) {
            if (mask & (1 << i) != 0) found[count++] = _partyAddresses[_idAt(partyIds, u.replicas + i)];
        }
        assembly ("memory-safe") {
            mstore(found, count)
        }
    }

    /// @dev Slashes the withhold penalty from `provider` into this contract; returns the amount received.
    function _penalizeWithholding(uint256 unitId, address provider) internal returns (uint256 slashed) {
        slashed = stakes.slash(provider, _withholdPenalty, address(this));
        emit RevealWithheld(unitId, provider, slashed);
    }

    function _payAccepted(address provider, uint128 price) internal {
        Account memory acc = _accounts[provider];
        acc.credit += price;
        acc.valid += 1;
        acc.consecutiveValid += 1;
        _accounts[provider] = acc;
    }

    function _recordFault(address provider) internal {
        Account storage acc = _accounts[provider];
        acc.fault += 1;
        acc.consecutiveValid = 0;
    }

    /// @dev Counts a fraud against `provider` and ends its streak of consecutive valid units.
    function _recordFraud(address provider) internal {
        Account storage acc = _accounts[provider];
        acc.fraud += 1;
        acc.consecutiveValid = 0;
    }

    /// @dev Releases a settling replica's collateral. A set-aside round-path unit's collateral is its
    /// roster's, released when the roster closes, except before a slash (`slashing`): then one
    /// `providerCollateral` of the roster's lock is released first, as for any unit, because StakeManager
    /// caps a slashed account's `locked` at what stays bonded, which would otherwise eat into the locks of
    /// the provider's other units once the roster releases its own; the roster then releases that much less.
    /// Once the roster's lock is spent by earlier slashes, nothing more is released.
    function _unlockProvider(Unit memory u, address provider, bool slashing) internal {
        if (!u.rostered) {
            stakes.unlock(provider, _providerCollateral);
            return;
        }
        if (!slashing) return;
        RosterLock storage lock = _rosterLocks[u.orderId][provider];
        if (lock.released + _providerCollateral > lock.held) return;
        lock.released += uint128(_providerCollateral); // <= held
        stakes.unlock(provider, _providerCollateral);
    }

    /// @dev An account's fault + fraud count mod 256: a roster compares it at close with its value at open.
    function _faultMark(Account memory account) internal pure returns (uint256) {
        return (uint256(account.fault) + account.fraud) & 0xff;
    }

    /// @dev A set-aside round-path unit has settled for good: its roster may close once none is left.
    function _closeSetAside(Unit memory u) internal {
        if (u.rostered) _rosters[u.orderId].openSetAside -= 1;
    }

    function _useNonce(address account, uint256 given) internal override {
        Party storage party = _parties[account];
        uint256 expected = party.nonce;
        if (given != expected) revert InvalidNonce(account, expected, given);
        party.nonce += 1;
    }

    /// @dev Pays `account` its whole credit now, as {withdrawCredit} would (a push at close, so that nobody
    /// needs a withdrawal of its own): the credit is zeroed before the token is called and, when the token
    /// refuses the transfer (reverts or returns false), put back for {withdrawCredit}, so a recipient the
    /// token refuses cannot block the close that pays it. Callers are nonReentrant and call it after their
    /// other effects.
    function _payCredit(address account) internal {
        uint128 amount = _accounts[account].credit;
        if (amount == 0) return;
        _accounts[account].credit = 0;
        _totals.credits -= amount;
        if (token.trySafeTransfer(account, amount)) {
            emit CreditWithdrawn(account, amount);
        } else {
            _accounts[account].credit += amount; // re-read: whatever else was credited meanwhile stays
            _totals.credits += amount;
            emit CreditKept(account, amount);
        }
    }

    function _withdrawCredit(address account) internal {
        Account storage acc = _accounts[account];
        uint128 amount = acc.credit;
        if (amount == 0) revert NothingToWithdraw(account);
        acc.credit = 0;
        _totals.credits -= amount;
        emit CreditWithdrawn(account, amount);
        token.safeTransfer(account, amount);
    }

    /// @dev Reverts unless the unit exists and is not yet settled.
    function _requireOpen(uint256 unitId, UnitState state) internal pure {
        if (state == UnitState.None) revert InvalidUnitState(unitId, uint8(state));
        if (state > UnitState.Revealing) revert UnitAlreadySettled(unitId);
    }

    function _countBits(uint256 mask) internal pure returns (uint256 count) {
        for (; mask != 0; mask &= mask - 1) ++count;
    }

    function _fullMask(uint8 replicas) internal pure returns (uint8) {
        return uint8((1 << replicas) - 1);
    }

    /// @dev Whether every replica of a fully revealed unit revealed the digest of replica 0.
    function _unanimous(uint256 unitId, Unit memory u) internal view returns (bool) {
        bytes32 digest = _digests[unitId][0];
        for (uint256 i = 1; i < u.replicas; ++i) {
            if (_loadReplica(unitId, u.page, i) != digest) return false;
        }
        return true;
    }
}

/// @title JobMarketDelegate
/// @notice What runs only inside {JobMarket}: the code JobMarket reaches by delegatecall, so every read and
/// write is JobMarket's (its storage, its roles, its token balance; events come from its address); called on
/// its own address it reverts ({NotDelegated}).
abstract contract JobMarketDelegate is JobMarketBase {
    /// @dev This contract's own address: code that runs here is running outside JobMarket's storage.
    address private immutable _self = address(this);

    /// @notice Called on this contract's own address instead of through {JobMarket}.
    error NotDelegated();

    modifier onlyDelegated() {
        if (address(this) == _self) revert NotDelegated();
        _;
    }

    /// @dev The open roster of `orderId`, after checking `providers` and `layout` are its own.
    function _openRoster(uint256 orderId, address[] calldata providers, uint256 layout)
        internal
        view
        returns (Roster memory roster)
    {
        roster = _rosters[orderId];
        if (roster.partiesHash == 0 || roster.closed) revert RosterNotOpen(orderId);
        bytes32 key = _rosterKey(providers, layout, roster.replicas, roster.unitsPerRound, roster.rounds);
        if (key != roster.partiesHash) revert RosterMismatch(orderId);
    }

    /// @dev How many replica slots of a round each provider holds, after checking the layout: every index in
    /// range, no provider twice in a unit, every provider used, no bits beyond the last slot.
    function _slotsPerProvider(address[] calldata providers, uint256 layout, uint256 k, uint256 unitCount)
        internal
        pure
        returns (uint256[] memory uses)
    {
        uint256 slots = unitCount * k;
        if (providers.length == 0 || providers.length > 32 || slots > 51 || layout >> (5 * slots) != 0) {
            revert InvalidLayout(slots);
        }
        uses = new uint256[](providers.length);
        for (uint256 i; i < slots; ++i) {
            uint256 p = (layout >> (5 * i)) & 31;
            if (p >= providers.length) revert InvalidLayout(i);
            for (uint256 j = i - (i % k); j < i; ++j) {
                if ((layout >> (5 * j)) & 31 == p) revert InvalidLayout(i);
            }
            ++uses[p];
        }
        for (uint256 p; p < uses.length; ++p) {
            if (uses[p] == 0) revert InvalidLayout(slots);
        }
    }

    /// @dev Makes unit `unit` of `round` an ordinary unit in state Revealing, every replica committed, replica
    /// `r`'s revealed digest (or an unrevealed replica's commitment: bit `r` of `unrevealed`) `values[r]`
    /// stored as the per-unit path stores them, drawn, its reveal deadline a second ago so that its verdict
    /// window is open from now (until `verdictWindow` later): the per-unit dispute path takes it from here.
    /// Returns its unit id.
    function _setAside(
        uint256 orderId,
        uint32 round,
        uint256 unit,
        address[] calldata providers,
        uint256 layout,
        bytes32[] memory values,
        uint256 unrevealed,
        address[] calldata verifiers,
        uint256[] memory uses
    ) internal returns (uint256 unitId) {
        uint256 k = values.length;
        unitId = _unitCounter.count + 1;
        _unitCounter.count = uint128(unitId);
        address[] memory unitProviders = new address[](k);
        uint256 partyIds;
        for (uint256 r; r < k; ++r) {
            uint256 index = (layout >> (5 * (unit * k + r))) & 31;
            unitProviders[r] = providers[index];
            partyIds |= _partyIdOf(providers[index]) << (r * PARTY_ID_BITS);
            _digests[unitId][r] = values[r];
            _setAsideSlots[orderId][index] += 1;
            _rosterLocks[orderId][providers[index]].held = uint128(uses[index] * _providerCollateral);
        }
        for (uint256 i; i < verifiers.length; ++i) {
            address verifier = verifiers[i];
            for (uint256 r; r < k; ++r) {
                if (unitProviders[r] == verifier) revert DuplicateParty(verifier);
            }
            for (uint256 j; j < i; ++j) {
                if (verifiers[j] == verifier) revert DuplicateParty(verifier);
            }
            partyIds |= _partyIdOf(verifier) << ((k + i) * PARTY_ID_BITS);
        }
        _unitParties[unitId] = partyIds;
        stakes.lockBatch(verifiers, _verifierCollateral);
        uint40 closed = uint40(block.timestamp) - 1; // its commit and reveal phases are over: verdicts open now
        uint8 all = _fullMask(uint8(k));
        uint8 revealed = all & ~uint8(unrevealed);
        _units[unitId] = Unit({
            orderId: uint64(orderId),
            commitDeadline: closed,
            revealDeadline: closed,
            state: UnitState.Revealing,
            replicas: uint8(k),
            verifierCount: uint8(verifiers.length),
            committedMask: all,
            revealedMask: revealed,
            drawn: true,
            page: 0,
            seedBlock: 0,
            rostered: true
        });
        bytes32 unitKey = bytes32(_roundUnitId(orderId, round, unit));
        emit UnitAssigned(unitId, orderId, unitKey, unitProviders, verifiers, closed);
        emit VerificationRequested(unitId);
        emit UnitSetAside(orderId, round, unit, unitId);
    }

    /// @dev keccak256(a, b) in scratch space, without allocating memory.
    function _chain(bytes32 a, bytes32 b) internal pure returns (bytes32 hashed) {
        assembly ("memory-safe") {
            mstore(0x00, a)
            mstore(0x20, b)
            hashed := keccak256(0x00, 0x40)
        }
    }

    /// @dev An audit chain extended by one record: keccak256(abi.encode(chain, info, digestsHash)) (the same
    /// three-word hash as {_roundUnitId}, without allocating).
    function _chainRecord(bytes32 chain, uint256 info, bytes32 digestsHash) internal pure returns (bytes32) {
        return bytes32(_roundUnitId(uint256(chain), info, uint256(digestsHash)));
    }

    /// @dev A posted chain extended by `records` in order (record `at`'s `info` read as `info`): each round
    /// record is chained into the pending chain, each posting's record into the posted chain with the pending
    /// chain before it. Records left pending at the end change the result (it is then no roster's).
    function _foldRecords(bytes32 chain, AuditRecord[] calldata records, uint256 at, uint256 info)
        internal
        pure
        returns (bytes32)
    {
        bytes32 pending;
        for (uint256 i; i < records.length; ++i) {
            uint256 recordInfo = i == at ? info : records[i].info;
            if (recordInfo >> 255 != 0) {
                chain = _chainRecord(chain, recordInfo, pending);
                pending = 0;
            } else {
                pending = _chainRecord(pending, recordInfo, records[i].digestsHash);
            }
        }
        return pending == 0 ? chain : ~chain;
    }
}

/// @title JobMarketVerdicts
/// @notice {JobMarket}'s verdict path: {submitVerdict}, {settleHeld} and {expireUnit}, part of
/// {JobMarketExtension}.
abstract contract JobMarketVerdicts is JobMarketDelegate {
    /// @notice Settles a unit by the signatures of a majority of its assigned verifiers
    /// (`verifierCount / 2 + 1`), one outcome per replica in assignment order: 0 accept (paid), 1 fault
    /// (unpaid; slashed the withhold penalty only when the replica committed and never revealed), 2 fraud
    /// (held: see {settleHeld}). The verifier fee and the withhold penalties' bounty are split evenly among
    /// the signing verifiers (rounding dust and the rest of the penalties are credited to the buyer); unpaid
    /// prices return to the order; every verifier's collateral is released. The verdict's outcomesHash is
    /// kept for appeals ({verdictHashOf}). Anyone may relay.
    function submitVerdict(uint256 unitId, uint8[] calldata outcomes, VerifierSignature[] calldata signatures)
        external
        onlyDelegated
        nonReentrant
    {
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _requireOpen(unitId, u.state);
        _checkVerdictWindow(unitId, u);
        _checkOutcomes(u, outcomes);
        bytes32 outcomesHash = keccak256(abi.encodePacked(outcomes));
        (address[] memory signers, uint256 signerMask) =
            _checkVerdictSignatures(unitId, u.replicas, u.verifierCount, outcomesHash, signatures);
        uint256 fraudMask = _fraudMask(outcomes); // after the signatures: live through their loop, a stack
        // slot too many for the verdict path alone in its extension
        unit.state = UnitState.Verdicted;
        _verdictHashes[unitId] = outcomesHash;
        _unpage(unitId, u);
        _releaseVerifiers(unitId, u);
        _settleVerdict(
            unitId, u, outcomes, signers, fraudMask == 0 ? 0 : fraudMask | (signerMask << 8) | (block.timestamp << 16)
        );
        if (fraudMask == 0) _closeSetAside(u); // else when its held fraud settles
        emit VerdictRecorded(unitId, outcomes, outcomesHash, signers);
    }

    /// @notice Settles a verdicted unit by its truth, once {VerdictAppeals} fixed it (the verdict unappealed
    /// past its appeal window or appealed and lapsed, or a panel's decision); `verdict`: the outcomes that
    /// settled the unit ({VerdictMismatch}). The replicas the verdict called fraud are held until then.
    /// Why held: a colluding verifier majority could otherwise slash an honest replica and take the bounty
    /// before the honest minority's appeal is decided. Until then such a replica keeps its collateral locked,
    /// its price in escrow, its streak reset and one fraud counted (taken back if the truth acquits it). By `truth`: fraud is slashed `slashAmount` (the bounty to
    /// the verdict's signers when `truth` is the verdict, all of it to the caller, which pays the deciding
    /// referees, when a panel overturned it), accept is paid its price, fault is unpaid; every held
    /// replica's collateral is released and unpaid prices are credited to the buyer. When `truth` overturns
    /// the verdict, every replica it calls fraud that the verdict did not (accepted and paid, or a fault) is
    /// slashed `slashAmount` to the caller too, its fraud counted and its streak ended ({_slashMissed}).
    /// Nothing held and the verdict standing: a no-op. Returns what was slashed to the caller.
    function settleHeld(uint256 unitId, uint8[] calldata verdict, uint8[] calldata truth)
        external
        onlyDelegated
        onlyRole(APPEALS_ROLE)
        nonReentrant
        returns (uint256 toCaller)
    {
        bytes32 verdictHash = _verdictHashes[unitId];
        if (keccak256(abi.encodePacked(verdict)) != verdictHash) revert VerdictMismatch(unitId);
        bool verdictStands = keccak256(abi.encodePacked(truth)) == verdictHash;
        uint256 held = _held[unitId];
        if (held == 0 && verdictStands) return 0;
        Unit memory u = _units[unitId];
        if (held != 0) {
            delete _held[unitId];
            toCaller = _settleHeld(unitId, u, truth, held, verdictStands ? address(this) : msg.sender);
            emit HeldSettled(unitId, truth);
        }
        if (!verdictStands) toCaller += _slashMissed(unitId, u, verdict, truth);
    }

    /// @dev {settleHeld}'s replicas; the stake slashed goes to `slashTo`. Returns what the caller received.
    function _settleHeld(uint256 unitId, Unit memory u, uint8[] calldata truth, uint256 held, address slashTo)
        private
        returns (uint256)
    {
        (uint256 paidCount, uint256 slashed) = _applyOutcomes(unitId, u, truth, held, slashTo);
        _closeSetAside(u);
        return _creditHeld(unitId, u, held, paidCount, slashed, slashTo == address(this));
    }

    /// @dev {settleHeld}'s fraud the overturned verdict missed, slashed to the caller. Such a replica's
    /// collateral is no longer its unit's: a per-unit replica's was released by the verdict, so none is
    /// released again; a set-aside replica's is its roster's, so while the roster is open one slot of the
    /// roster's lock is released first, as before any slash of a set-aside replica ({_unlockProvider}:
    /// otherwise StakeManager's cap of `locked` at what stays bonded would let the roster's close release
    /// the locks of the provider's other units). A closed roster released its lock already.
    function _slashMissed(uint256 unitId, Unit memory u, uint8[] calldata verdict, uint8[] calldata truth)
        private
        returns (uint256 slashed)
    {
        bool rosterLocked = u.rostered && !_rosters[u.orderId].closed;
        for (uint256 i; i < verdict.length; ++i) {
            if (truth[i] != OUTCOME_FRAUD || verdict[i] == OUTCOME_FRAUD) continue;
            address provider = _partyAt(unitId, i);
            if (rosterLocked) _unlockProvider(u, provider, true);
            _recordFraud(provider);
            uint256 taken = stakes.slash(provider, _slashAmount, msg.sender);
            slashed += taken;
            emit ReplicaSlashed(unitId, provider, taken);
        }
    }

    /// @dev {settleHeld}'s money: prices to the accepted, refunds to the buyer and, when the verdict stands,
    /// the slash's bounty to the verdict's signers and the rest to the buyer. Returns what was slashed to
    /// the caller (only when the verdict fell: the caller pays the referees who overturned it).
    function _creditHeld(uint256 unitId, Unit memory u, uint256 held, uint256 paidCount, uint256 slashed, bool verdictStands)
        private
        returns (uint256 toCaller)
    {
        Order storage order = _orders[u.orderId];
        uint256 price = order.pricePerReplica;
        uint256 paid = paidCount * price;
        uint256 refunds = (_countBits(held & 0xff) - paidCount) * price;
        uint256 bounty;
        if (verdictStands) {
            bounty = _payEach(_verifiersAt(unitId, u, (held >> 8) & 0xff), (slashed * _bountyBps) / BPS);
        } else {
            toCaller = slashed;
            slashed = 0;
        }
        _accounts[order.buyer].credit += SafeCast.toUint128(refunds + slashed - bounty);
        Totals memory totals = _totals;
        totals.escrow -= uint128(paid + refunds);
        totals.credits += SafeCast.toUint128(paid + refunds + slashed);
        _totals = totals;
    }

    /// @notice Expires a unit nobody settled by its verdict deadline: releases all collateral, counts a
    /// fault for every replica that never revealed, and returns the unit's whole cost to the order, the
    /// verifier fee included: assigned verifiers that let a unit expire earn nothing. Permissionless. A
    /// unanimous unit not drawn is refused ({UnitFinalizable}): its providers finalize it themselves, so an
    /// operator that withholds the fast path cannot hand their pay back to the buyer.
    function expireUnit(uint256 unitId) external onlyDelegated {
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _requireOpen(unitId, u.state);
        uint64 verdictDeadline = _verdictDeadline(u);
        if (block.timestamp <= verdictDeadline) revert UnitNotExpired(unitId, verdictDeadline);
        if (!u.drawn && u.revealedMask == _fullMask(u.replicas) && _unanimous(unitId, u)) {
            revert UnitFinalizable(unitId);
        }
        unit.state = UnitState.Expired;
        _unpage(unitId, u);
        uint256 penalties;
        for (uint256 i; i < u.replicas; ++i) {
            address provider = _partyAt(unitId, i);
            bool revealed = u.revealedMask & (1 << i) != 0;
            _unlockProvider(u, provider, !revealed && u.committedMask & (1 << i) != 0);
            if (revealed) continue;
            _recordFault(provider);
            if (u.committedMask & (1 << i) != 0) penalties += _penalizeWithholding(unitId, provider);
        }
        _releaseVerifiers(unitId, u);
        Order storage order = _orders[u.orderId];
        order.balance += order.pricePerReplica * u.replicas + order.verifierFeePerUnit;
        order.openUnits -= 1;
        if (penalties != 0) {
            _accounts[order.buyer].credit += SafeCast.toUint128(penalties);
            _totals.credits += SafeCast.toUint128(penalties);
        }
        _closeSetAside(u);
        emit UnitExpired(unitId);
    }
}

/// @title JobMarketRoundAudits
/// @notice The round path's audit disputes and way out ({challengeAudit}, {setAsidePending},
/// {releaseAuditSigners}): part of {JobMarketExtension}, beside the verdict path their set-aside units take,
/// because {JobMarketRounds} with them no longer fits one contract's 24,576 bytes (EIP-170).
abstract contract JobMarketRoundAudits is JobMarketDelegate {
    /// @notice Challenges the round audit of unit `at & 0xff` of the round record `records[at >> 8]` (operator
    /// only, within `verdictWindow` of the posting that covered it, the first posting record after it): for a
    /// known answer the unit missed (a canary) or any doubt of the audit. The unit is set aside as a step sets
    /// one aside (with the operator's `verifiers`, none of whom signed the posting), so it settles on the
    /// per-unit path (verdict, held fraud, {VerdictAppeals}) instead of at close, and the posting's signers
    /// are not counted it at close; when the unit's truth has fraud, VerdictAppeals slashes each of them
    /// ({auditSignersOf}). `records` are the roster's audit records from a posting's first round record to the
    /// last posted one, as last emitted ({RoundRevealed} / {AuditPosted} / {AuditChallenged}), `prefix` the posted chain before
    /// them ({RosterAudits}), `digests` the round's unit digests (of {RoundRevealed}), `auditors` the
    /// roster's verifiers: with them they must hash to the roster's audit key ({AuditMismatch} otherwise), and
    /// the round's record is updated in it.
    function challengeAudit(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        uint256 at,
        bytes32 prefix,
        AuditRecord[] calldata records,
        bytes32[] calldata digests,
        address[] calldata auditors,
        address[] calldata verifiers
    ) external onlyDelegated onlyRole(OPERATOR_ROLE) nonReentrant {
        Roster memory roster = _openRoster(orderId, providers, layout);
        bytes32 verifiersHash = keccak256(abi.encode(auditors));
        uint256 index = at >> 8;
        uint256 info = index < records.length ? records[index].info : 1 << 255;
        uint32 round = uint32(info >> 176);
        if (
            _chain(verifiersHash, _foldRecords(prefix, records, type(uint256).max, 0)) != _rosterAudits[orderId].key
                || info >> 255 != 0 || keccak256(abi.encodePacked(digests)) != records[index].digestsHash
        ) revert AuditMismatch(orderId, round);
        uint256 posting = index;
        while (records[posting].info >> 255 == 0) ++posting; // the fold ended on a posting
        uint64 until = uint64(uint40(records[posting].info >> 72)) + _verdictWindow;
        if (block.timestamp > until) revert AuditChallengeClosed(orderId, round, until);
        uint256 audited = uint64(info);
        uint256 bit = 1 << uint8(at);
        if (audited & bit == 0 || (info >> 112) & bit != 0) revert NotAudited(orderId, round, uint8(at));
        _checkVerifierCount(verifiers.length);
        uint256 signerMask = uint8(records[posting].info >> 64);
        uint256 signerIds;
        uint256 signers;
        for (uint256 i; i < auditors.length; ++i) {
            if (signerMask & (1 << i) == 0) continue;
            for (uint256 j; j < verifiers.length; ++j) {
                if (verifiers[j] == auditors[i]) revert DuplicateParty(auditors[i]);
            }
            signerIds |= uint256(_parties[auditors[i]].id) << (PARTY_ID_BITS * signers++);
        }
        uint256 k = roster.replicas;
        bytes32[] memory values = new bytes32[](k);
        bytes32 digest = digests[uint8(at)];
        for (uint256 r; r < k; ++r) {
            values[r] = digest;
        }
        uint256[] memory uses = _slotsPerProvider(providers, layout, k, roster.unitsPerRound);
        uint256 unitId = _setAside(orderId, round, uint8(at), providers, layout, values, 0, verifiers, uses);
        _auditSigners[unitId] = signerIds | (signerMask << 232) | (signers << 240);
        roster.setAsideUnits += 1;
        roster.openSetAside += 1;
        _rosters[orderId] = roster;
        info |= bit << 112;
        _rosterAudits[orderId].key = _chain(verifiersHash, _foldRecords(prefix, records, index, info));
        emit AuditChallenged(orderId, round, uint8(at), unitId, info);
    }

    /// @notice Takes the last `records.length` pending round records off the roster's pending chain, so that no
    /// posting can pay their units any more: the way out of pending audits. With `verifiers` (the operator's,
    /// as a step passes them) each of their units is set aside for a verdict as a step sets one aside
    /// ({UnitSetAside}), every replica revealing the record's digest (`digests`: each record's round's unit
    /// digests, records in order); for when the roster's verifiers will not sign them. Without (anyone, after
    /// the order's deadline and `verdictWindow`: the operator and the verifiers had that long to post or set
    /// them aside) each is dropped as an expired unit whose replicas all revealed: unpaid and not counted
    /// valid, its budget back to the order, its collateral released with the roster's, no verifier paid
    /// ({UnitSetAside} with unit id 0). `kept` is the pending chain before them, which stays pending (zero:
    /// none), `committed` the chained commitments of the round committed and not revealed (zero: none); with
    /// them the records must hash to the roster's round hash ({AuditMismatch} otherwise; {EntryCountMismatch}
    /// for `digests` not `unitsPerRound` a record when setting aside).
    function setAsidePending(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        bytes32 kept,
        AuditRecord[] calldata records,
        bytes32[] calldata digests,
        bytes32 committed,
        address[] calldata verifiers
    ) external onlyDelegated nonReentrant {
        Roster memory roster = _openRoster(orderId, providers, layout);
        Order storage order = _orders[orderId];
        bytes32 pending = kept;
        for (uint256 i; i < records.length; ++i) {
            pending = _chainRecord(pending, records[i].info, records[i].digestsHash);
        }
        if (!roster.auditsPending || _chain(committed, pending) != _roundHashes[orderId]) {
            revert AuditMismatch(orderId, roster.committed);
        }
        if (verifiers.length != 0) {
            _checkRole(OPERATOR_ROLE);
            _checkVerifierCount(verifiers.length);
        } else if (block.timestamp <= order.deadline + _verdictWindow) {
            revert RosterNotClosable(orderId, order.deadline + _verdictWindow);
        }
        uint256 n = roster.unitsPerRound;
        uint256 k = roster.replicas;
        if (verifiers.length != 0 && digests.length != records.length * n) {
            revert EntryCountMismatch(records.length * n, digests.length);
        }
        uint256[] memory uses = _slotsPerProvider(providers, layout, k, n);
        bytes32[] memory values = new bytes32[](k);
        for (uint256 i; i < records.length; ++i) {
            uint256 info = records[i].info;
            uint32 round = uint32(info >> 176);
            if (verifiers.length != 0 && keccak256(abi.encodePacked(digests[i * n:(i + 1) * n])) != records[i].digestsHash) {
                revert AuditMismatch(orderId, round);
            }
            for (uint256 unit; unit < n; ++unit) {
                if ((info >> unit) & 1 == 0) continue;
                uint256 unitId;
                if (verifiers.length != 0) {
                    for (uint256 r; r < k; ++r) {
                        values[r] = digests[i * n + unit];
                    }
                    unitId = _setAside(orderId, round, unit, providers, layout, values, 0, verifiers, uses);
                    roster.openSetAside += 1;
                } else {
                    for (uint256 slot = unit * k; slot < (unit + 1) * k; ++slot) {
                        _setAsideSlots[orderId][(layout >> (5 * slot)) & 31] += 1;
                    }
                    order.balance += uint128(k * order.pricePerReplica + order.verifierFeePerUnit);
                    order.openUnits -= 1;
                    emit UnitSetAside(orderId, round, unit, 0);
                }
                roster.setAsideUnits += 1;
            }
        }
        _roundHashes[orderId] = kept == 0 ? committed : _chain(committed, kept);
        roster.auditsPending = kept != 0;
        _rosters[orderId] = roster;
        emit PendingSetAside(orderId, records.length);
    }

    /// @notice Releases, once per roster verifier, the roster collateral of each signer of the round audit of
    /// `unitId` (a unit {challengeAudit} set aside) while the roster is open (VerdictAppeals only, before it
    /// slashes them, {VerdictAppeals-slashRoundAudit}): StakeManager caps a slashed account's `locked` at what
    /// stays bonded, which would otherwise eat into the signer's other locks once the close released the
    /// roster's. The close then skips them ({RosterAudits-released}); once it closed, nothing is left to release.
    function releaseAuditSigners(uint256 unitId) external onlyDelegated onlyRole(APPEALS_ROLE) nonReentrant {
        uint256 packed = _auditSigners[unitId];
        uint256 orderId = _units[unitId].orderId;
        if (packed == 0 || _rosters[orderId].closed) return;
        uint8 released = _rosterAudits[orderId].released;
        uint256 mask = (packed >> 232) & 0xff;
        uint256 fresh = mask & ~uint256(released);
        if (fresh == 0) return;
        _rosterAudits[orderId].released = released | uint8(fresh);
        uint256 s;
        for (uint256 i; mask >> i != 0; ++i) {
            if (mask & (1 << i) == 0) continue;
            if (fresh & (1 << i) != 0) stakes.unlock(_partyAddresses[_idAt(packed, s)], _verifierCollateral);
            ++s;
        }
    }
}

/// @title JobMarketRounds
/// @notice {JobMarket}'s round path: an order whose providers stay the same from round to round (DiLoCo
/// workers keep their shard) settles each round in one transaction instead of three per unit. Part of
/// {JobMarketExtension}, so a round-path order is an ordinary order (escrow, credits, reputation and
/// collateral on the same ledger).
///
/// - {openRoster} (operator): fixes which provider works each replica slot of every round, each provider
///   accepting the whole roster by one `Accept` signature (unitKey = the roster's key,
///   {JobMarket-rosterKey}); locks each provider's collateral once for the order (one `providerCollateral`
///   per slot it holds) and moves the budget of every unit of every round out of the order's balance.
/// - {stepRound} (anyone): reveals the pending round (every replica's opening checked against the round's
///   chained commitments; each unit drawn by the hash of the block that committed it, at the spot-check
///   rates) and commits the next (every replica slot's commitment, for the unit id {JobMarket-roundUnitId},
///   each roster provider's one `RoundCommit` signature over its slots' commitments ecrecovered, and the
///   commitments chained into one stored hash). Nothing is written per unit or per provider.
/// - {closeRoster}: credits each provider its price for every replica slot of every revealed round but
///   set-aside units (one write per provider per order), counts them valid, releases the collateral,
///   returns unspent budget and the unused verifier fees to the order.
///
/// A unit that needs a verdict — drawn, its replicas disagree, or one of its providers is below the
/// roster's required streak (on probation, or a fault or fraud since the roster opened) — is set aside by
/// the step that reveals it: it becomes an ordinary unit (revealed, drawn, with the verifiers the operator
/// passes to that step) that settles on the per-unit path ({submitVerdict}, held fraud, appeals,
/// {expireUnit}) while the roster keeps its providers' collateral until both are settled. A replica that
/// does not open its commitment within `revealWindow` of the round's commit does not hold the round up:
/// the step gives its slot as withheld (with its commitment, as signed), its unit is set aside with that
/// replica committed and unrevealed, and the verdict can only call it a fault, which costs it
/// `withholdPenalty` of stake (as on the per-unit path). A provider whose opening the relayer leaves out
/// publishes it itself ({publishOpening}; in time only before the window ends: after it the operator's
/// step may give the slot as withheld), and a step then takes it from the chain. The
/// market service does not use this path yet.
abstract contract JobMarketRounds is JobMarketDelegate {
    /// @notice A round's commitments: every replica slot's (slot order; each {JobMarket-commitmentOf} with
    /// {JobMarket-roundUnitId}) and each roster provider's compact (EIP-2098) signature (roster provider
    /// order) over `RoundCommit(orderId, round, provider, commitmentsHash, deadline)`, `commitmentsHash` the
    /// keccak256 of its own slots' commitments in slot order (abi.encodePacked): one signature per provider
    /// per round instead of one per slot.
    struct RoundWork {
        bytes32[] commitments;
        CompactSignature[] signatures;
    }

    /// @notice An EIP-2098 compact signature.
    struct CompactSignature {
        bytes32 r;
        bytes32 vs;
    }

    /// @notice A replica's opening: the preimage of its commitment ({JobMarket-commitmentOf} with
    /// {JobMarket-roundUnitId}).
    struct Opening {
        bytes32 resultDigest;
        bytes32 salt;
    }

    /// @notice Roster verifier `verifier`'s (its index among the roster's verifiers) compact (EIP-2098)
    /// signature over `RoundAudit(orderId, records)`.
    struct AuditSignature {
        uint256 verifier;
        bytes32 r;
        bytes32 vs;
    }

    /// @notice A step's round audits: `pending` the chain of the roster's round records no posting covers yet
    /// (zero: none; checked against the roster's round hash); when `signatures` is not empty, a posting: the
    /// roster's verifiers and its posted chain (checked against its audit key, {RosterAudits}) and their
    /// signatures over the pending chain once the step's own round record is added.
    struct RoundAudit {
        bytes32 pending;
        address[] verifiers;
        bytes32 chain;
        AuditSignature[] signatures;
    }

    /// @notice Opens the roster of `orderId`: `rounds` rounds of `unitsPerRound` units of `replicas` replicas
    /// each, replica slot `i = unit * replicas + replica` worked by `providers[(layout >> 5 * i) & 31]`
    /// (distinct providers within a unit, every provider used). Each provider signs
    /// `Accept(orderId, rosterKey, provider, nonce, deadline)`. For fewer replicas than the order's most,
    /// every provider needs the order's trusted streak; a provider on probation is taken, and every unit it
    /// works is set aside for a verdict. `verifiers` (none, or `minVerifiers` to MAX_VERIFIERS distinct
    /// accounts that are not providers of the roster) audit the units the chain draws ({stepRound}); each
    /// locks `verifierCollateral` until the roster closes, and the providers' `Accept` key covers them
    /// ({JobMarket-rosterKey}).
    function openRoster(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        uint8 replicas,
        uint32 unitsPerRound,
        uint32 rounds,
        address[] calldata verifiers,
        SignedApproval[] calldata accepts
    ) external onlyDelegated onlyRole(OPERATOR_ROLE) nonReentrant {
        Order storage order = _orders[orderId];
        if (order.buyer == address(0)) revert UnknownOrder(orderId);
        if (order.closed) revert OrderNotOpen(orderId);
        if (block.timestamp > order.deadline) revert OrderExpired(orderId, order.deadline);
        if (_rosters[orderId].partiesHash != 0) revert RosterExists(orderId);
        if (replicas < order.minReplicas || replicas > order.replicas) revert InvalidReplicaCount(replicas);
        if (unitsPerRound == 0 || rounds == 0) revert ZeroUnits();
        if (accepts.length != providers.length) revert ProviderCountMismatch(providers.length, accepts.length);
        uint256 units = uint256(unitsPerRound) * rounds;
        uint256 cost = units * (replicas * uint256(order.pricePerReplica) + order.verifierFeePerUnit);
        if (order.delivered + uint256(order.openUnits) + units > order.units || cost > order.balance) {
            revert NoUnitBudget(orderId);
        }
        uint256[] memory uses = _slotsPerProvider(providers, layout, replicas, unitsPerRound);
        uint256 required = replicas < order.replicas ? order.trustedStreak : 0;
        uint16 requiredStreak = required < _probationStreak ? _probationStreak : uint16(required);
        bytes32 partiesKey = _rosterKey(providers, layout, replicas, unitsPerRound, rounds);
        bytes32 key = _acceptKey(partiesKey, verifiers);
        if (verifiers.length != 0) _lockAuditors(orderId, providers, verifiers);
        uint256 faultMarks;
        for (uint256 p; p < providers.length; ++p) {
            address provider = providers[p];
            for (uint256 q; q < p; ++q) {
                if (providers[q] == provider) revert DuplicateParty(provider);
            }
            Account memory account = _accounts[provider];
            if (account.consecutiveValid < required) revert ProviderNotTrusted(provider, uint16(required));
            faultMarks |= _faultMark(account) << (8 * p);
            _acceptProvider(orderId, key, provider, accepts[p]);
            stakes.lock(provider, uses[p] * _providerCollateral);
        }
        order.balance -= uint128(cost); // <= balance
        order.openUnits += uint32(units); // <= order.units
        _rosters[orderId] = Roster({
            partiesHash: partiesKey,
            unitsPerRound: uint8(unitsPerRound), // <= 51: checked by _slotsPerProvider
            requiredStreak: requiredStreak,
            rounds: rounds,
            committed: 0,
            pendingBlock: 0,
            pendingSince: 0,
            replicas: replicas,
            closed: false,
            setAsideUnits: 0,
            openSetAside: 0,
            auditsPending: false,
            faultMarks: faultMarks
        });
        emit RosterOpened(orderId, providers, layout, replicas, unitsPerRound, rounds);
    }

    /// @notice Reveals the pending round (when one is pending: `openings` for every replica slot, in slot
    /// order) and commits the next (when `work.commitments` is not empty: every replica slot's commitment
    /// and each roster provider's `RoundCommit(orderId, round, provider, commitmentsHash, deadline)`
    /// signature over its slots' commitments, see {RoundWork}). Anyone
    /// may relay: the signatures and openings are the authorization. The pending round is revealed only in
    /// a later block than the one that committed it; a unit that needs a verdict is set aside (see the
    /// contract's notice) with `verifiers` (the operator's: at least `minVerifiers`, none of the unit's
    /// providers, each locking `verifierCollateral`), so a step that sets a unit aside must come from the
    /// operator ({RoundUnitNeedsVerdict} otherwise). Bit `i` of `withheld` gives slot `i` as not opened
    /// (only after the round's reveal window, {RoundRevealWindowOpen}): its entry in `openings` then carries
    /// the slot's commitment in `resultDigest` (its salt is ignored), and the slot counts as revealed only if
    /// its provider published its opening ({publishOpening}). With no round pending, `openings` are
    /// ignored: whoever revealed it first (anyone may copy openings from a pending transaction) does not
    /// make the relayer's reveal-and-commit fail.
    ///
    /// Round audits, deferred: the units of the revealed round drawn by the seed, unanimous and with no
    /// provider below the roster's streak (bit `u` for unit `u`), are not set aside but pending, their round's
    /// record (`info` = the units | round << 176, `digestsHash` the keccak of their agreed digests in unit
    /// order) appended to the roster's pending chain (`audit.pending` before the step, kept in its round
    /// hash), when the roster has verifiers and the step posts or has no `verifiers` (anyone's: a pending unit
    /// is paid only once a posting covers it; the operator pends a round only holding its verifiers'
    /// signatures over the pending chain through it, and with `verifiers` sets them aside instead, as when its
    /// verifiers refuse to sign; pending records are set aside or dropped by
    /// {JobMarketRoundAudits-setAsidePending}). A step that posts
    /// (`audit.signatures`, a majority of the roster's verifiers `audit.verifiers` as opened, each over
    /// `RoundAudit(orderId, records)`, `records` the pending chain once the step's round record is added;
    /// `audit.chain` the roster's posted chain, {RosterAudits}) covers every pending record: their units are
    /// paid at close like undrawn ones, each signer is counted them (its share of their fee), and the operator
    /// may challenge each of them for `verdictWindow` from this step ({JobMarketRoundAudits-challengeAudit}). A
    /// posting without a quorum, or with a signature that is not its roster verifier's over exactly that
    /// message, reverts the step; the roster cannot close while records are pending ({AuditsPending}). A step
    /// with no round to reveal and no work may post alone. Split units and units of a provider below the
    /// streak are always set aside.
    function stepRound(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        Opening[] calldata openings,
        uint256 withheld,
        address[] calldata verifiers,
        uint256 deadline,
        RoundWork calldata work,
        RoundAudit calldata audit
    ) external onlyDelegated {
        Roster memory roster = _openRoster(orderId, providers, layout);
        bytes32 pending = audit.pending;
        if (roster.pendingBlock != 0) {
            pending = _revealRound(orderId, roster, providers, layout, openings, withheld, verifiers, audit);
            roster.pendingBlock = 0;
            roster.pendingSince = 0;
        } else {
            // no round to reveal: records are pending only after a reveal-only step, which stored their chain
            if (roster.auditsPending ? _chain(0, pending) != _roundHashes[orderId] : pending != 0) {
                revert AuditMismatch(orderId, roster.committed);
            }
            if (work.commitments.length == 0 && audit.signatures.length == 0) revert EmptyBatch();
        }
        if (audit.signatures.length != 0) {
            _postAudits(orderId, pending, audit);
            pending = 0;
        }
        if (work.commitments.length != 0) {
            bytes32 chained = _commitRound(orderId, roster, providers, layout, deadline, work);
            _roundHashes[orderId] = pending == 0 ? chained : _chain(chained, pending);
            roster.pendingBlock = uint40(block.number);
            roster.pendingSince = uint40(block.timestamp);
            roster.committed += 1;
        } else if (pending != 0) {
            _roundHashes[orderId] = _chain(0, pending);
        }
        roster.auditsPending = pending != 0;
        _rosters[orderId] = roster;
    }

    /// @notice Publishes the opening of replica slot `slot` of the pending round, so that a step cannot give
    /// it as withheld: for a provider whose relayer leaves its opening out. `commitments` are every slot's
    /// commitment of the round (public: the commit step's calldata), checked with `pending` (the roster's
    /// pending audit chain, {RoundAudit}) against the round's hash. Permissionless: the opening is the
    /// authorization.
    function publishOpening(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        uint256 slot,
        bytes32 resultDigest,
        bytes32 salt,
        bytes32[] calldata commitments,
        bytes32 pending
    ) external onlyDelegated {
        Roster memory roster = _openRoster(orderId, providers, layout);
        if (roster.pendingBlock == 0) revert NoRoundToStep(orderId, roster.committed);
        uint256 k = roster.replicas;
        if (commitments.length != roster.unitsPerRound * k) {
            revert EntryCountMismatch(roster.unitsPerRound * k, commitments.length);
        }
        if (slot >= commitments.length) revert InvalidLayout(slot);
        uint32 round = roster.committed - 1;
        bytes32 chained = _chain(bytes32(orderId), bytes32(uint256(round)));
        for (uint256 i; i < commitments.length; ++i) {
            chained = _chain(chained, commitments[i]);
        }
        if (pending != 0) chained = _chain(chained, pending);
        if (chained != _roundHashes[orderId]) revert RoundHashMismatch(orderId, round);
        address provider = providers[(layout >> (5 * slot)) & 31];
        uint256 unitId = _roundUnitId(orderId, round, slot / k);
        if (_commitmentOf(resultDigest, salt, provider, unitId) != commitments[slot]) {
            revert RevealMismatch(unitId, provider);
        }
        _publishedOpenings[_roundUnitId(orderId, round, slot)] = resultDigest;
        emit OpeningPublished(orderId, round, slot, resultDigest);
    }

    /// @notice Closes the roster: each provider is credited its price and counted valid for every replica
    /// slot it holds in every revealed round but set-aside units (their verdicts paid them), its collateral
    /// is released (no set-aside unit may still be open or hold fraud), and the budget of the units not
    /// paid (a round left pending, rounds never committed) and every unit's verifier fee return to the
    /// order. Anyone may close once every round is revealed, or after the order's deadline and, when a round
    /// is pending, the reveal window after its commit (so that a buyer closing at the deadline cannot cut
    /// off a round its providers are revealing). Never while an audited round's challenge window is open;
    /// then each roster verifier (`verifiers`, as opened) is credited `verifierFeePerUnit / verifiers.length`
    /// for every audited unit it signed that no challenge took back, and its collateral is released.
    /// Last, each provider and verifier is paid its whole credit (a token transfer each; one the token refuses
    /// stays a credit for {withdrawCredit}), so no party of a roster needs a withdrawal of its own.
    /// `records`: every audit record of the roster in order ({RoundRevealed}, {AuditPosted}, as updated by
    /// {AuditChallenged}); none may be pending ({AuditsPending});
    /// with `verifiers` they must hash to the roster's audit key ({AuditorsMismatch} otherwise).
    function closeRoster(
        uint256 orderId,
        address[] calldata providers,
        uint256 layout,
        address[] calldata verifiers,
        AuditRecord[] calldata records
    ) external onlyDelegated nonReentrant {
        Roster memory roster = _openRoster(orderId, providers, layout);
        Order storage order = _orders[orderId];
        if (roster.committed != roster.rounds || roster.pendingBlock != 0) {
            uint64 closableAfter = order.deadline;
            uint64 revealEnds = roster.pendingSince + _revealWindow;
            if (roster.pendingBlock != 0 && revealEnds > closableAfter) closableAfter = revealEnds;
            if (block.timestamp <= closableAfter) revert RosterNotClosable(orderId, closableAfter);
        }
        if (roster.auditsPending) revert AuditsPending(orderId);
        uint256 auditFees = _payAuditors(orderId, verifiers, records, order.verifierFeePerUnit);
        if (roster.openSetAside != 0) revert UnitsStillOpen(orderId, roster.openSetAside);
        uint32 settled = roster.committed - (roster.pendingBlock != 0 ? 1 : 0);
        uint256[] memory uses = _slotsPerProvider(providers, layout, roster.replicas, roster.unitsPerRound);
        uint128 price = order.pricePerReplica;
        uint256 paid;
        for (uint256 p; p < providers.length; ++p) {
            address provider = providers[p];
            uint256 count = uses[p] * settled;
            uint256 release = uses[p] * _providerCollateral;
            if (roster.setAsideUnits != 0) {
                count -= _setAsideSlots[orderId][p];
                release -= _rosterLocks[orderId][provider].released;
            }
            if (count != 0) {
                Account memory account = _accounts[provider];
                account.credit += uint128(count * price);
                account.valid += uint32(count);
                if (_faultMark(account) == (roster.faultMarks >> (8 * p)) & 0xff) {
                    account.consecutiveValid += uint32(count);
                }
                _accounts[provider] = account;
                paid += count * price;
            }
            stakes.unlock(provider, release);
        }
        uint256 units = uint256(roster.unitsPerRound) * roster.rounds - roster.setAsideUnits; // the rest settle alone
        uint256 reserved = units * (roster.replicas * uint256(price) + order.verifierFeePerUnit);
        order.balance += uint128(reserved - paid - auditFees);
        order.delivered += roster.unitsPerRound * settled - roster.setAsideUnits;
        order.openUnits -= uint32(units);
        roster.closed = true;
        _rosters[orderId] = roster;
        Totals memory totals = _totals;
        totals.escrow -= uint128(paid + auditFees);
        totals.credits += uint128(paid + auditFees);
        _totals = totals;
        emit RosterClosed(orderId, settled, paid);
        for (uint256 p; p < providers.length; ++p) {
            _payCredit(providers[p]);
        }
        for (uint256 i; i < verifiers.length; ++i) {
            _payCredit(verifiers[i]);
        }
    }

    /// @dev At close: checks `verifiers` and `records` are the roster's (none when it has no verifiers), that no
    /// record is pending ({AuditsPending}) and that no posting can still be challenged, credits each verifier
    /// its audit fees (per posting it signed, the units it covered that no challenge took back) and releases its
    /// collateral. Returns the fees.
    function _payAuditors(uint256 orderId, address[] calldata verifiers, AuditRecord[] calldata records, uint256 fee)
        private
        returns (uint256 total)
    {
        bytes32 key = _rosterAudits[orderId].key;
        if (key == 0) {
            if (verifiers.length != 0 || records.length != 0) revert AuditorsMismatch(orderId);
            return 0;
        }
        if (_chain(keccak256(abi.encode(verifiers)), _foldRecords(0, records, type(uint256).max, 0)) != key) {
            revert AuditorsMismatch(orderId);
        }
        uint256[] memory counts = new uint256[](verifiers.length);
        uint256 challenged; // some unit was challenged: its signers' collateral may have been released
        uint256 units; // the round records' unchallenged units since the last posting
        uint256 last; // the last posting's info
        for (uint256 j; j < records.length; ++j) {
            uint256 info = records[j].info;
            if (info >> 255 == 0) {
                challenged |= uint64(info >> 112);
                units += _countBits(uint64(info) & ~(info >> 112));
                continue;
            }
            for (uint256 i; i < counts.length; ++i) {
                if ((info >> (64 + i)) & 1 != 0) counts[i] += units;
            }
            units = 0;
            last = info;
        }
        if (last != 0) {
            uint64 until = uint64(uint40(last >> 72)) + _verdictWindow;
            if (block.timestamp <= until) revert RosterNotClosable(orderId, until);
        }
        uint256 share = fee / verifiers.length;
        for (uint256 i; i < verifiers.length; ++i) {
            uint256 amount = counts[i] * share;
            if (amount != 0) {
                _accounts[verifiers[i]].credit += uint128(amount); // <= the roster's escrowed fees
                total += amount;
            }
        }
        if (challenged == 0) {
            // nothing challenged, nothing released ({releaseAuditSigners} runs only for a challenged unit)
            stakes.unlockBatch(verifiers, _verifierCollateral);
            return total;
        }
        uint256 released = _rosterAudits[orderId].released;
        for (uint256 i; i < verifiers.length; ++i) {
            if (released & (1 << i) == 0) stakes.unlock(verifiers[i], _verifierCollateral);
        }
    }

    /// @dev Checks the round's openings against its chained commitments (and the pending audit chain), leaves the
    /// drawn unanimous units pending a posting where it may (see {stepRound}), then sets aside every unit that
    /// needs a verdict. Returns the pending audit chain.
    function _revealRound(
        uint256 orderId,
        Roster memory roster,
        address[] calldata providers,
        uint256 layout,
        Opening[] calldata openings,
        uint256 withheld,
        address[] calldata verifiers,
        RoundAudit calldata audit
    ) private returns (bytes32 pending) {
        uint256 k = roster.replicas;
        uint256 unitCount = roster.unitsPerRound;
        if (openings.length != unitCount * k) revert EntryCountMismatch(unitCount * k, openings.length);
        uint256 seedBlock = roster.pendingBlock;
        if (block.number <= seedBlock) revert RoundRevealTooEarly(orderId, seedBlock);
        uint32 round = roster.committed - 1;
        if (withheld != 0) {
            if (withheld >> openings.length != 0) revert InvalidLayout(openings.length);
            uint64 windowEnd = roster.pendingSince + _revealWindow;
            if (block.timestamp <= windowEnd) revert RoundRevealWindowOpen(orderId, windowEnd);
        }
        bytes32 seed = blockhash(seedBlock); // zero after 256 blocks: every unit counts as drawn
        uint256 weak = _weakProviders(roster.requiredStreak, providers);
        bytes32 chained = _chain(bytes32(orderId), bytes32(uint256(round)));
        bytes32[] memory digests = new bytes32[](unitCount); // replica 0's of each unit
        uint256 setAside; // bit u: unit u needs a verdict
        uint256 split; // bit u: its replicas disagree, or one did not reveal
        uint256 auditable; // bit u: drawn by the seed alone (not split, no weak provider): a round audit may pay it
        for (uint256 unit; unit < unitCount; ++unit) {
            uint256 unitId = _roundUnitId(orderId, round, unit);
            bool drawn = _drawnBy(unitId, uint8(k), seed);
            if (drawn) auditable |= 1 << unit;
            for (uint256 i = unit * k; i < (unit + 1) * k; ++i) {
                uint256 index = (layout >> (5 * i)) & 31;
                bytes32 commitment = openings[i].resultDigest; // a withheld slot's entry carries it
                bytes32 digest = commitment;
                if (withheld & (1 << i) == 0) {
                    commitment = _commitmentOf(digest, openings[i].salt, providers[index], unitId);
                } else {
                    digest = _slotValue(orderId, round, i, commitment);
                    if (digest == commitment) split |= 1 << unit; // not opened: a verdict decides
                }
                chained = _chain(chained, commitment);
                if (i == unit * k) digests[unit] = digest;
                else if (digest != digests[unit]) split |= 1 << unit;
                if (weak & (1 << index) != 0) {
                    drawn = true;
                    auditable &= ~(1 << unit);
                }
            }
            if (drawn || split & (1 << unit) != 0) setAside |= 1 << unit;
        }
        pending = audit.pending;
        if (pending != 0) chained = _chain(chained, pending);
        if (chained != _roundHashes[orderId]) revert RoundHashMismatch(orderId, round);
        auditable &= ~split;
        if (
            auditable != 0 && (pending != 0 || _rosterAudits[orderId].key != 0)
                && (audit.signatures.length != 0 || verifiers.length == 0)
        ) {
            setAside &= ~auditable; // pending: paid at close only once a posting covers them
            pending = _chainRecord(pending, auditable | (uint256(round) << 176), _hashWords(digests));
        } else {
            auditable = 0;
        }
        emit RoundRevealed(orderId, round, digests, auditable);
        if (setAside == 0) return pending;
        uint256[] memory uses = _slotsPerProvider(providers, layout, k, unitCount);
        uint256 verifierCount = verifiers.length;
        bytes32[] memory values = new bytes32[](k);
        for (uint256 unit; unit < unitCount; ++unit) {
            if (setAside & (1 << unit) == 0) continue;
            if (!hasRole(OPERATOR_ROLE, msg.sender) || verifierCount < _minVerifiers || verifierCount > MAX_VERIFIERS) {
                revert RoundUnitNeedsVerdict(orderId, round, unit, split & (1 << unit) == 0);
            }
            uint256 unrevealed; // bit r: replica r did not open
            for (uint256 r; r < k; ++r) {
                uint256 slot = unit * k + r;
                bytes32 value = openings[slot].resultDigest;
                if (withheld & (1 << slot) != 0) {
                    value = _slotValue(orderId, round, slot, value);
                    if (value == openings[slot].resultDigest) unrevealed |= 1 << r;
                }
                values[r] = value;
            }
            _setAside(orderId, round, unit, providers, layout, values, unrevealed, verifiers, uses);
            roster.setAsideUnits += 1;
            roster.openSetAside += 1;
        }
    }

    /// @dev A posting: checks the roster's verifiers and posted chain, each signature a distinct verifier's
    /// `RoundAudit` over exactly the pending chain `pending` (a wrong one reverts) and a quorum (a majority of
    /// the roster's verifiers), then chains the posting's record into the roster's audit key (no records
    /// pending: the close counts the covered units to each signer, a challenge takes one back).
    function _postAudits(uint256 orderId, bytes32 pending, RoundAudit calldata audit) private {
        address[] calldata auditors = audit.verifiers;
        bytes32 verifiersHash = keccak256(abi.encode(auditors));
        bytes32 key = _rosterAudits[orderId].key;
        if (key == 0 || pending == 0 || _chain(verifiersHash, audit.chain) != key) {
            revert AuditorsMismatch(orderId);
        }
        bytes32 typed = _hashTypedDataV4(keccak256(abi.encode(ROUND_AUDIT_TYPEHASH, orderId, pending)));
        uint256 signerMask;
        AuditSignature[] calldata signatures = audit.signatures;
        for (uint256 s; s < signatures.length; ++s) {
            uint256 index = signatures[s].verifier;
            if (index >= auditors.length) revert InvalidLayout(index);
            address auditor = auditors[index];
            if (signerMask & (1 << index) != 0) revert DuplicateParty(auditor);
            signerMask |= 1 << index;
            (address signer,,) = ECDSA.tryRecover(typed, signatures[s].r, signatures[s].vs);
            if (signer != auditor) revert InvalidSigner(auditor, signer);
        }
        uint256 required = auditors.length / 2 + 1;
        if (signatures.length < required) revert QuorumNotReached(orderId, signatures.length, required);
        uint256 info = (1 << 255) | (signerMask << 64) | (block.timestamp << 72);
        _rosterAudits[orderId].key = _chain(verifiersHash, _chainRecord(audit.chain, info, pending));
        emit AuditPosted(orderId, info, pending);
    }

    /// @dev Checks the roster's verifiers (count, distinct, not its providers) and locks their collateral.
    function _lockAuditors(uint256 orderId, address[] calldata providers, address[] calldata verifiers) private {
        _checkVerifierCount(verifiers.length);
        _checkVerifiers(providers, verifiers);
        stakes.lockBatch(verifiers, _verifierCollateral);
        _rosterAudits[orderId].key = _chain(keccak256(abi.encode(verifiers)), 0); // no record yet
        emit RosterVerifiers(orderId, verifiers);
    }

    /// @dev A withheld slot's value: its published opening's digest, or (none published) its commitment.
    function _slotValue(uint256 orderId, uint32 round, uint256 slot, bytes32 commitment)
        private
        view
        returns (bytes32 value)
    {
        value = _publishedOpenings[_roundUnitId(orderId, round, slot)];
        if (value == 0) value = commitment;
    }

    /// @dev The roster providers (as a bit mask of their indices) whose consecutive valid units are below
    /// the roster's `requiredStreak`. A fault or fraud since the roster opened resets a streak, so from then
    /// on every unit the provider works is checked.
    function _weakProviders(uint256 required, address[] calldata providers) private view returns (uint256 weak) {
        if (required == 0) return 0;
        for (uint256 p; p < providers.length; ++p) {
            if (_accounts[providers[p]].consecutiveValid < required) weak |= 1 << p;
        }
    }

    /// @dev Checks round `roster.committed`'s commitments (one per replica slot) against each roster
    /// provider's `RoundCommit` signature and returns their chained hash (the step stores it, with the
    /// pending audit chain).
    function _commitRound(
        uint256 orderId,
        Roster memory roster,
        address[] calldata providers,
        uint256 layout,
        uint256 deadline,
        RoundWork calldata work
    ) private returns (bytes32 chained) {
        uint32 round = roster.committed;
        if (round == roster.rounds) revert NoRoundToStep(orderId, round);
        uint64 orderDeadline = _orders[orderId].deadline;
        if (block.timestamp > orderDeadline) revert OrderExpired(orderId, orderDeadline);
        if (block.timestamp > deadline) revert SignatureExpired(deadline, block.timestamp);
        bytes32[] calldata commitments = work.commitments;
        uint256 slots = roster.unitsPerRound * uint256(roster.replicas);
        if (commitments.length != slots) revert EntryCountMismatch(slots, commitments.length);
        if (work.signatures.length != providers.length) {
            revert EntryCountMismatch(providers.length, work.signatures.length);
        }
        chained = _chain(bytes32(orderId), bytes32(uint256(round)));
        for (uint256 i; i < slots; ++i) {
            chained = _chain(chained, commitments[i]);
        }
        // once per step, not per signature: inside JobMarket's delegatecall EIP712 rebuilds it on every call
        bytes32 domain = _domainSeparatorV4();
        bytes32[] memory own = new bytes32[](slots);
        for (uint256 p; p < providers.length; ++p) {
            uint256 n;
            for (uint256 i; i < slots; ++i) {
                if (((layout >> (5 * i)) & 31) == p) own[n++] = commitments[i];
            }
            address provider = providers[p];
            bytes32 structHash = _roundCommitHash(orderId, round, provider, _hashWords(own, n), deadline);
            CompactSignature calldata signature = work.signatures[p];
            (address recovered,,) =
                ECDSA.tryRecover(MessageHashUtils.toTypedDataHash(domain, structHash), signature.r, signature.vs);
            if (recovered != provider) revert InvalidSigner(provider, recovered);
        }
        emit RoundCommitted(orderId, round);
    }

    /// @dev keccak256(abi.encode(ROUND_COMMIT_TYPEHASH, orderId, round, provider, commitmentsHash, deadline))
    /// without allocating (one per roster provider of a round).
    function _roundCommitHash(
        uint256 orderId,
        uint256 round,
        address provider,
        bytes32 commitmentsHash,
        uint256 deadline
    ) private pure returns (bytes32 structHash) {
        bytes32 typeHash = ROUND_COMMIT_TYPEHASH;
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            mstore(ptr, typeHash)
            mstore(add(ptr, 0x20), orderId)
            mstore(add(ptr, 0x40), round)
            mstore(add(ptr, 0x60), and(provider, 0xffffffffffffffffffffffffffffffffffffffff))
            mstore(add(ptr, 0x80), commitmentsHash)
            mstore(add(ptr, 0xa0), deadline)
            structHash := keccak256(ptr, 0xc0)
        }
    }

    /// @dev keccak256 of the first `n` of `words`, packed, without copying them.
    function _hashWords(bytes32[] memory words, uint256 n) private pure returns (bytes32 hashed) {
        assembly ("memory-safe") {
            hashed := keccak256(add(words, 0x20), shl(5, n))
        }
    }

    /// @dev keccak256(abi.encodePacked(words)) without copying them.
    function _hashWords(bytes32[] memory words) private pure returns (bytes32 hashed) {
        assembly ("memory-safe") {
            hashed := keccak256(add(words, 0x20), shl(5, mload(words)))
        }
    }

}

/// @title JobMarketExtension
/// @notice The code of {JobMarket} that does not fit its 24,576 bytes (EIP-170): the verdict path, in a
/// contract deployed before JobMarket, which takes its address (checking its token, stake manager and
/// parameters are its own) and reaches it by delegatecall. The round path is {JobMarketRoundsExtension}.
contract JobMarketExtension is JobMarketVerdicts, JobMarketRoundAudits {
    constructor(IERC20 token_, StakeManager stakes_, Params memory params_) JobMarketBase(token_, stakes_, params_) {}
}

/// @title JobMarketRoundsExtension
/// @notice {JobMarket}'s round path ({JobMarketRounds}) in a contract of its own, deployed before JobMarket
/// as {JobMarketExtension} is and checked the same way: with round audits the two paths no longer fit one
/// contract's 24,576 bytes (EIP-170).
contract JobMarketRoundsExtension is JobMarketRounds {
    constructor(IERC20 token_, StakeManager stakes_, Params memory params_) JobMarketBase(token_, stakes_, params_) {}
}

/// @title JobMarket
/// @notice Escrow and settlement of Veritrain training orders. A buyer posts an order and escrows
/// `units × (replicas × pricePerReplica + verifierFeePerUnit)`. The operator (the market service's
/// relayer) assigns a unit to `replicas` distinct staked providers, each of whom accepted by EIP-712
/// signature, and to a few staked verifiers. Providers commit to their result, then reveal it. Unanimous
/// reveals are finalized by the operator (fast path; anyone's after the verdict deadline); otherwise, or when the unit was drawn for a spot check,
/// a majority of the unit's assigned verifiers signs a verdict per replica: accept (paid), fault (unpaid;
/// slashed only the withhold penalty when it committed and never revealed) or fraud (held until the unit's
/// truth is fixed on {VerdictAppeals}, then slashed, with a bounty to the signing verifiers and the rest to
/// the buyer, or paid if a referee panel overturned the verdict: {settleHeld}). Each
/// verifier locks `verifierCollateral` of stake for the unit. A verdict can be appealed to a referee
/// panel ({VerdictAppeals}, which reads {verdictHashOf}); only that contract slashes a verifier whose
/// signed outcomes contradict the unit's refereed truth. A unit nobody settles expires after its verdict deadline and its
/// budget returns to the order (its verifiers earn nothing). Payouts are credits that leave through
/// {withdrawCredit}, but for the closes: {closeOrder} pays the buyer and {JobMarketRounds-closeRoster} the
/// roster's parties their whole credit directly (one credited is kept when the token refuses the transfer).
///
/// Spot checks are drawn by the contract: when the last replica commits, the unit records that block
/// as its seed block; reveals are refused until a later block, and the first reveal (or {finalize})
/// fixes the draw `keccak256(blockhash(seedBlock), unitId) % 1e6 < spotCheckPpm` (soloSpotCheckPpm
/// for single-replica units). So the draw is fixed before any reveal is visible and no revealer can
/// time it. A unit with a provider on probation (fewer than `probationStreak` consecutive valid units,
/// the streak a fault or fraud resets) is drawn at assignment: a ring of fresh keys holding every replica
/// is always verified. A replica that committed but did not reveal by the reveal deadline loses `withholdPenalty`
/// of stake when the unit settles by verdict or expiry, so withholding is no free option.
///
/// @dev Time: every deadline is the last second at which its phase is open (inclusive), like an
/// ERC-2612 deadline, and all are fixed at assignment: revealDeadline = commitDeadline + revealWindow.
/// Commit phase: now <= commitDeadline. Reveal phase: after all replicas committed (from the block after
/// the last commit) or now > commitDeadline, until revealDeadline. Verdict: after all revealed or now > revealDeadline, until
/// verdictDeadline = revealDeadline + verdictWindow. Expiry: now > verdictDeadline.
///
/// EIP-712 domain ("Veritrain JobMarket", "1", chainId, this). Typed messages:
/// - `Accept(uint256 orderId,bytes32 unitKey,address provider,uint256 nonce,uint256 deadline)` with an
///   UNORDERED nonce: any unused value works (a per-account bitmap, as Permit2), so a provider can sign
///   several acceptances before any is relayed and they land in any order ({AcceptNonceUsed} on reuse)
/// - `Commit(uint256 unitId,address provider,bytes32 commitment,uint256 nonce,uint256 deadline)`
/// - `Verdict(uint256 unitId,bytes32 outcomesHash,uint256 deadline)` with
///   `outcomesHash = keccak256(abi.encodePacked(uint8[] outcomes))`; packed encoding pads array
///   elements, so this is keccak256 of one 32-byte big-endian word per outcome. Outcome-only: reasons
///   carry measurements each verifier makes on its own hardware, so they stay off chain and honest
///   verifiers agree byte for byte. No nonce: a unit settles once, so the unit's state machine makes the
///   signature single-use (as `UnitCommit`); after settlement it serves only as evidence.
/// - `WithdrawCredit(address account,uint256 nonce,uint256 deadline)`
/// - `UnitCommit(uint256 unitId,address provider,bytes32 commitment,uint256 deadline)` ({commitBatch}):
///   no nonce, because the unit's state machine makes it single-use (a provider commits once per unit,
///   unit ids never repeat, the domain binds chain and contract), so it needs no ordering either
/// Commitment: `keccak256(abi.encode(bytes32 resultDigest, bytes32 salt, address provider, uint256 unitId))`
/// (see {commitmentOf}).
///
/// Deviations from the agreed interface (contract_spec.md), and why:
/// 1. Every `...WithSig` function and every signature struct passes the signed `nonce` explicitly
///    (before `deadline`), so a replay reverts with {InvalidNonce}(account, expected, given) instead of a
///    wrong-signer error: `commitWithSig(unitId, provider, commitment, nonce, deadline, sig)`,
///    `withdrawCreditWithSig(account, nonce, deadline, sig)`.
/// 2. `assign(orderId, unitKey, providers, verifiers, SignedApproval[] accepts)` with
///    `SignedApproval{nonce, deadline, signature}` per provider, in provider order.
/// 3. `submitVerdict(unitId, outcomes, VerifierSignature[] signatures)` with
///    `VerifierSignature{verifier, deadline, signature}`; the quorum is a majority of the unit's assigned
///    verifiers (`verifierCount / 2 + 1`); the `minVerifiers` parameter bounds how few a unit may have.
/// 4. Order and unit ids start at 1 (0 means "none").
/// 5. An order keeps a token `balance` (escrow not committed to an open unit) and a `delivered` count:
///    {assign} needs `delivered + openUnits < units` and `balance >= unitCost`. Finalize returns the unit's
///    verifier fee to the balance; a verdict returns unpaid replica prices; an expired unit returns its
///    whole cost. So a unit whose replicas all failed can be re-assigned under a new unitKey while the
///    balance covers it. {closeOrder} credits the balance to the buyer.
/// 6. `specHash` and `unitKey` are kept only in the {OrderPosted}/{UnitAssigned} events (gas).
/// 7. Spot checks are drawn on chain (see above); the operator's {requestVerification} can only add
///    draws (audits). A drawn unit can only settle by verdict or expiry. A verdict may mark `accept` or `fraud` only for replicas that revealed.
/// 8. StakeManager's signed forms pass the nonce too: `requestUnstakeWithSig(staker, amount, nonce,
///    deadline, sig)`, `withdrawWithSig(staker, nonce, deadline, sig)`; it adds the view `bondedOf`.
/// 9. Fee-on-transfer tokens are refused ({TransferAmountMismatch}) instead of under-funding escrow.
/// 10. Batch entry points (additions; every single-message function above still works unchanged):
///    {commitBatch}(unitId, SignedCommit[]) relays several `UnitCommit` signatures; {revealBatch}(unitId,
///    Reveal[]) reveals several replicas and finalizes in the same transaction when that completes a
///    unanimous unit not drawn for verification; {multicall}(bytes[]) lets the operator put several
///    units' actions in one transaction. StakeManager adds `lockBatch`/`unlockBatch`.
/// 11. {postAdaptiveOrder} adds adaptive replication: {assign} takes minReplicas..replicas providers, fewer
///    than `replicas` only when each has `trustedStreak` consecutive valid units ({ProviderNotTrusted}); a
///    unit costs its own replica count. {getOrder} returns `minReplicas` and `trustedStreak` (fixed orders:
///    minReplicas = replicas, trustedStreak = 0).
/// Sequential nonces ({nonces}) remain only for `Commit` and `WithdrawCredit`, shared per account: a
/// relayer must submit those in nonce order. Accept uses unordered nonces, Verdict and UnitCommit none.
///
/// Gas (3 replicas, 2 verifiers, steady state, test-contracts/gas.test.js): a unit of a multi-unit order
/// settles in about 431k over three transactions (assign 182k, commitBatch 103k, revealBatch with
/// finalize 145k, which includes the spot-check draw, about 1k). Before verifiers locked collateral it was 399k (assign 170k, finalize 127k): locking
/// the verifiers at assign costs about 12k and releasing them at settlement 18k; the Accept nonce bitmap
/// costs as much as the sequential nonce when a provider draws consecutive nonces (one word per 256).
/// The 399k then broke down as: 63k transaction base, 66k three fresh slots (unit header, packed party ids, replica 0's
/// commitment), 86k 41 cold reads and 64k 22 rewrites of existing slots (both including StakeManager),
/// 21k six signature checks, 16k events, about 17k calldata. Replicas 1.. commit into recycled pages
/// (5k instead of 22k a slot), parties are stored as 24-bit registry ids (one slot for up to ten), and
/// an account's nonce and party id share a slot. Pipelined by {multicall} (reveal unit k, commit unit
/// k+1 and assign unit k+2 in one transaction): about 329k a unit (313k before verifier collateral).
contract JobMarket is JobMarketBase {
    /// @notice The contract holding the verdict path ({JobMarketExtension}), which this one runs by
    /// delegatecall.
    address public immutable extension;
    /// @notice The contract holding the round path ({JobMarketRoundsExtension}), run by delegatecall likewise.
    address public immutable roundsExtension;

    /// @param token_ Payment token (must equal the stake manager's token).
    /// @param stakes_ Stake registry; grant this contract its MARKET_ROLE after deployment.
    /// @param operator Holder of OPERATOR_ROLE (the deployer becomes admin).
    /// @param params_ Market parameters (0 < windows <= MAX_WINDOW, 1 <= minVerifiers <= MAX_VERIFIERS,
    /// slash <= collateral, bounty <= 100 %, verifierCollateral > 0,
    /// spot-check rates <= 1e6 ppm, withholdPenalty <= slashAmount).
    /// @param extension_ A {JobMarketExtension} deployed with the same token, stake manager and parameters
    /// (checked: its code runs in this contract's storage with its own immutables). Deployed on its own, not
    /// by this constructor: with its creation code inside this one's, JobMarket's creation code was 566
    /// bytes under EIP-3860's 49,152.
    /// @param roundsExtension_ A {JobMarketRoundsExtension} deployed likewise (checked likewise).
    constructor(
        IERC20 token_,
        StakeManager stakes_,
        address operator,
        Params memory params_,
        JobMarketExtension extension_,
        JobMarketRoundsExtension roundsExtension_
    ) JobMarketBase(token_, stakes_, params_) {
        if (operator == address(0)) revert InvalidParameter("operator");
        if (address(extension_).code.length == 0 || extension_.configHash() != configHash) {
            revert InvalidParameter("extension");
        }
        if (address(roundsExtension_).code.length == 0 || roundsExtension_.configHash() != configHash) {
            revert InvalidParameter("roundsExtension");
        }
        extension = address(extension_);
        roundsExtension = address(roundsExtension_);
        _grantRole(DEFAULT_ADMIN_ROLE, msg.sender);
        _grantRole(OPERATOR_ROLE, operator);
    }

    // ----------------------------------------------------------------------------------------------
    // Buyer
    // ----------------------------------------------------------------------------------------------

    /// @notice Posts an order with a fixed replica count and pulls its escrow (needs an allowance).
    /// @param specHash Digest of the off-chain order specification (kept in the event only).
    /// @param units Number of units to deliver.
    /// @param replicas Replicas per unit, 1..MAX_REPLICAS.
    /// @param pricePerReplica Paid to each accepted replica of a unit.
    /// @param verifierFeePerUnit Shared by the signing verifiers when a unit needs a verdict.
    /// @param deadline Last second at which units may be assigned; afterwards anyone may close the order.
    /// @return orderId The new order's id.
    function postOrder(
        bytes32 specHash,
        uint32 units,
        uint8 replicas,
        uint256 pricePerReplica,
        uint256 verifierFeePerUnit,
        uint64 deadline
    ) external nonReentrant returns (uint256 orderId) {
        return _postOrder(specHash, units, replicas, replicas, 0, pricePerReplica, verifierFeePerUnit, deadline);
    }

    /// @notice Posts an order with adaptive replication (BOINC's): each unit has `minReplicas` to
    /// `maxReplicas` providers, fewer than `maxReplicas` only when every one of them has at least
    /// `trustedStreak` consecutive valid units (a fault or fraud resets the streak), and a unit of one
    /// replica is audited by the chain's solo spot-check draw. Escrow covers `maxReplicas` per unit; what
    /// a smaller unit does not use stays in the order and is refunded when it closes.
    function postAdaptiveOrder(
        bytes32 specHash,
        uint32 units,
        uint8 minReplicas,
        uint8 maxReplicas,
        uint16 trustedStreak,
        uint256 pricePerReplica,
        uint256 verifierFeePerUnit,
        uint64 deadline
    ) external nonReentrant returns (uint256 orderId) {
        if (minReplicas == 0 || minReplicas > maxReplicas) revert InvalidReplicaBounds(minReplicas, maxReplicas);
        return _postOrder(
            specHash, units, minReplicas, maxReplicas, trustedStreak, pricePerReplica, verifierFeePerUnit, deadline
        );
    }

    /// @notice Closes an order and pays its remaining balance to the buyer (with the rest of the buyer's credit;
    /// kept as its credit when the token refuses the transfer). The buyer may close at any
    /// time, anyone else after the order deadline; no unit of the order may be open.
    function closeOrder(uint256 orderId) external nonReentrant {
        Order storage order = _orders[orderId];
        address buyer = order.buyer;
        if (buyer == address(0)) revert UnknownOrder(orderId);
        if (order.closed) revert OrderNotOpen(orderId);
        if (msg.sender != buyer && block.timestamp <= order.deadline) {
            revert OrderNotClosable(orderId, order.deadline);
        }
        if (order.openUnits != 0) revert UnitsStillOpen(orderId, order.openUnits);
        uint128 refund = order.balance;
        order.balance = 0;
        order.closed = true;
        _accounts[buyer].credit += refund;
        Totals memory totals = _totals;
        totals.escrow -= refund;
        totals.credits += refund;
        _totals = totals;
        emit OrderClosed(orderId, refund);
        _payCredit(buyer);
    }

    // ----------------------------------------------------------------------------------------------
    // Operator
    // ----------------------------------------------------------------------------------------------

    /// @notice Assigns one unit of `orderId` to `providers` (one per replica, each accepting by signature,
    /// each locking `providerCollateral` of free stake) and `verifiers` (each locking `verifierCollateral`
    /// of free stake until the unit settles or expires). A provider on probation draws the unit.
    /// @param unitKey Off-chain identifier of the unit's work (round, shard); kept in the event only.
    /// @param accepts The providers' `Accept` signatures, in provider order.
    /// @return unitId The new unit's id.
    function assign(
        uint256 orderId,
        bytes32 unitKey,
        address[] calldata providers,
        address[] calldata verifiers,
        SignedApproval[] calldata accepts
    ) external onlyRole(OPERATOR_ROLE) returns (uint256 unitId) {
        (uint8 replicas, uint16 trustedStreak) =
            _reserveUnitBudget(orderId, providers.length, accepts.length, verifiers.length);
        uint8 page;
        (unitId, page) = _newUnit(replicas);
        uint256 partyIds;
        bool probation;
        for (uint256 i; i < providers.length; ++i) {
            address provider = providers[i];
            for (uint256 j; j < i; ++j) {
                if (providers[j] == provider) revert DuplicateParty(provider);
            }
            uint32 streak = _accounts[provider].consecutiveValid;
            if (streak < trustedStreak) revert ProviderNotTrusted(provider, trustedStreak);
            probation = probation || streak < _probationStreak;
            _acceptProvider(orderId, unitKey, provider, accepts[i]);
            partyIds |= _partyIdOf(provider) << (i * PARTY_ID_BITS);
        }
        stakes.lockBatch(providers, _providerCollateral);
        _unitParties[unitId] = partyIds | _checkVerifiers(providers, verifiers);
        stakes.lockBatch(verifiers, _verifierCollateral);
        uint40 commitDeadline = uint40(block.timestamp + _commitWindow);
        _units[unitId] = Unit({
            orderId: uint64(orderId), // ids are sequential, far below 2**64
            commitDeadline: commitDeadline,
            revealDeadline: commitDeadline + uint40(_revealWindow),
            state: UnitState.Committing,
            replicas: replicas,
            verifierCount: uint8(verifiers.length),
            committedMask: 0,
            revealedMask: 0,
            drawn: probation,
            page: page,
            seedBlock: 0,
            rostered: false
        });
        emit UnitAssigned(unitId, orderId, unitKey, providers, verifiers, commitDeadline);
        if (probation) emit VerificationRequested(unitId);
    }

    /// @notice Draws an open unit for a verifier spot check (an audit on top of the on-chain draw), so it
    /// can no longer be finalized on the fast path. Idempotent.
    function requestVerification(uint256 unitId) external onlyRole(OPERATOR_ROLE) {
        Unit storage unit = _units[unitId];
        _requireOpen(unitId, unit.state);
        unit.drawn = true;
        emit VerificationRequested(unitId);
    }

    // ----------------------------------------------------------------------------------------------
    // Providers
    // ----------------------------------------------------------------------------------------------

    /// @notice Commits the caller's result for `unitId`; see {commitmentOf}.
    function commit(uint256 unitId, bytes32 commitment) external {
        _commit(unitId, msg.sender, commitment);
    }

    /// @notice Signed form of {commit}; anyone may relay.
    function commitWithSig(
        uint256 unitId,
        address provider,
        bytes32 commitment,
        uint256 nonce,
        uint256 deadline,
        bytes calldata signature
    ) external {
        _useNonce(provider, nonce);
        _checkSignature(
            provider,
            keccak256(abi.encode(COMMIT_TYPEHASH, unitId, provider, commitment, nonce, deadline)),
            deadline,
            signature
        );
        _commit(unitId, provider, commitment);
    }

    /// @notice Relays several providers' signed `UnitCommit` messages for one unit in one transaction.
    /// @dev `UnitCommit(uint256 unitId,address provider,bytes32 commitment,uint256 deadline)` has no nonce:
    /// the unit's state machine makes it single-use. A provider commits at most once per unit
    /// ({AlreadyCommitted}), unit ids are never reused, and the EIP-712 domain binds chain and contract,
    /// so a relayed message can take effect once at most; replaying it reverts. Entries may come in any
    /// order and need not cover every provider; any bad entry reverts the whole batch.
    function commitBatch(uint256 unitId, SignedCommit[] calldata commits) external {
        if (commits.length == 0) revert EmptyBatch();
        for (uint256 i; i < commits.length; ++i) {
            SignedCommit calldata c = commits[i];
            _checkSignature(
                c.provider,
                keccak256(abi.encode(UNIT_COMMIT_TYPEHASH, unitId, c.provider, c.commitment, c.deadline)),
                c.deadline,
                c.signature
            );
            _commit(unitId, c.provider, c.commitment);
        }
    }

    /// @notice Reveals `provider`'s result digest. Permissionless: knowing the commitment's preimage
    /// (digest and salt, bound to provider and unit) is the authorization, so any relayer may submit it
    /// and nobody can reveal for another provider without that provider's salt.
    function reveal(uint256 unitId, address provider, bytes32 resultDigest, bytes32 salt) external {
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _checkRevealWindow(unitId, u);
        _decideDraw(unitId, unit, u);
        uint256 index = _checkReveal(unitId, u, provider, resultDigest, salt);
        _storeReplica(unitId, u.page, index, resultDigest);
        unit.revealedMask = u.revealedMask | uint8(1 << index);
    }

    /// @notice Reveals several replicas of one unit (permissionless, like {reveal}) and, when the operator
    /// sends it and it completes the reveals with one unanimous digest on a unit not drawn for
    /// verification, finalizes it in the same transaction (as {finalize}). Differing digests do not revert: the unit then waits
    /// for a verdict. Any bad entry reverts the whole batch.
    /// @return finalized Whether the unit was finalized.
    function revealBatch(uint256 unitId, Reveal[] calldata reveals) external returns (bool finalized) {
        if (reveals.length == 0) revert EmptyBatch();
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _checkRevealWindow(unitId, u);
        _decideDraw(unitId, unit, u);
        address[MAX_REPLICAS] memory revealers;
        bytes32[MAX_REPLICAS] memory revealed;
        uint8 batchMask;
        for (uint256 i; i < reveals.length; ++i) {
            Reveal calldata r = reveals[i];
            uint256 index = _checkReveal(unitId, u, r.provider, r.resultDigest, r.salt);
            u.revealedMask |= uint8(1 << index);
            batchMask |= uint8(1 << index);
            revealers[index] = r.provider;
            revealed[index] = r.resultDigest;
        }
        uint8 replicas = u.replicas;
        // only the operator's relay finalizes here: a reveal sent by anyone else waits for the operator's
        // known-answer check (see {finalize})
        finalized = !u.drawn && u.revealedMask == _fullMask(replicas) && hasRole(OPERATOR_ROLE, msg.sender);
        bytes32 digest = batchMask & 1 != 0 ? revealed[0] : _digests[unitId][0];
        for (uint256 i = 1; finalized && i < replicas; ++i) {
            if ((batchMask & (1 << i) != 0 ? revealed[i] : _loadReplica(unitId, u.page, i)) != digest) {
                finalized = false;
            }
        }
        unit.revealedMask = u.revealedMask;
        if (finalized) {
            // A finalized unit's replicas all hold `digest`: entry 0 alone stores it ({replicaOf}).
            if (batchMask & 1 != 0) _digests[unitId][0] = digest;
            _finalize(unitId, unit, u, digest, revealers);
        } else {
            for (uint256 i; i < replicas; ++i) {
                if (batchMask & (1 << i) != 0) _storeReplica(unitId, u.page, i, revealed[i]);
            }
        }
    }

    // ----------------------------------------------------------------------------------------------
    // Settlement
    // ----------------------------------------------------------------------------------------------

    /// @notice Settles a unit whose replicas all revealed the same digest and that was not drawn for a
    /// spot check: pays every replica, releases collateral, returns the verifier fee to the order.
    /// The operator's until the verdict deadline, then anyone's ({FinalizeReserved}): a provider that
    /// reveals straight on chain cannot settle its unit before the operator has checked its digest
    /// against a canary's known answer, and an operator that never finalizes cannot keep honest providers
    /// from their pay ({expireUnit} refuses such a unit).
    function finalize(uint256 unitId) external {
        Unit storage unit = _units[unitId];
        Unit memory u = unit;
        _requireOpen(unitId, u.state);
        if (u.drawn) revert UnitUnderVerification(unitId);
        if (u.revealedMask != _fullMask(u.replicas)) revert RevealsIncomplete(unitId);
        if (!_unanimous(unitId, u)) revert NotUnanimous(unitId);
        uint64 verdictDeadline = _verdictDeadline(u);
        if (block.timestamp <= verdictDeadline && !hasRole(OPERATOR_ROLE, msg.sender)) {
            revert FinalizeReserved(unitId, verdictDeadline);
        }
        address[MAX_REPLICAS] memory unknown;
        _finalize(unitId, unit, u, _digests[unitId][0], unknown);
    }

    /// @notice Settles a unit by a majority of its verifiers' signatures; see {JobMarketVerdicts-submitVerdict}.
    function submitVerdict(uint256, uint8[] calldata, VerifierSignature[] calldata) external {
        _delegate();
    }

    /// @notice Settles a verdict's held fraud by the unit's truth (VerdictAppeals only); see
    /// {JobMarketVerdicts-settleHeld}.
    function settleHeld(uint256, uint8[] calldata, uint8[] calldata) external returns (uint256) {
        _delegate();
    }

    /// @notice Expires a unit nobody settled by its verdict deadline; see {JobMarketVerdicts-expireUnit}.
    function expireUnit(uint256) external {
        _delegate();
    }

    // ----------------------------------------------------------------------------------------------
    // Round path (see {JobMarketRounds})
    // ----------------------------------------------------------------------------------------------

    /// @notice Fixes a round-path order's roster; see {JobMarketRounds-openRoster}.
    function openRoster(
        uint256,
        address[] calldata,
        uint256,
        uint8,
        uint32,
        uint32,
        address[] calldata,
        SignedApproval[] calldata
    ) external {
        _delegateRounds();
    }

    /// @notice Reveals a roster's pending round and commits its next; see {JobMarketRounds-stepRound}.
    function stepRound(
        uint256,
        address[] calldata,
        uint256,
        JobMarketRounds.Opening[] calldata,
        uint256,
        address[] calldata,
        uint256,
        JobMarketRounds.RoundWork calldata,
        JobMarketRounds.RoundAudit calldata
    ) external {
        _delegateRounds();
    }

    /// @notice Publishes a provider's opening of the pending round; see {JobMarketRounds-publishOpening}.
    function publishOpening(uint256, address[] calldata, uint256, uint256, bytes32, bytes32, bytes32[] calldata, bytes32)
        external
    {
        _delegateRounds();
    }

    /// @notice Pays a roster's revealed rounds and releases it; see {JobMarketRounds-closeRoster}.
    function closeRoster(uint256, address[] calldata, uint256, address[] calldata, AuditRecord[] calldata) external {
        _delegateRounds();
    }

    /// @notice Sets aside a unit a round audit paid (operator); see {JobMarketRoundAudits-challengeAudit}.
    function challengeAudit(
        uint256,
        address[] calldata,
        uint256,
        uint256,
        bytes32,
        AuditRecord[] calldata,
        bytes32[] calldata,
        address[] calldata,
        address[] calldata
    ) external {
        _delegate();
    }

    /// @notice Sets aside or drops a roster's pending round records; see {JobMarketRoundAudits-setAsidePending}.
    function setAsidePending(
        uint256,
        address[] calldata,
        uint256,
        bytes32,
        AuditRecord[] calldata,
        bytes32[] calldata,
        bytes32,
        address[] calldata
    ) external {
        _delegate();
    }

    /// @notice Releases the roster collateral of a challenged audit's signers before VerdictAppeals slashes
    /// them; see {JobMarketRoundAudits-releaseAuditSigners}.
    function releaseAuditSigners(uint256) external {
        _delegate();
    }

    /// @dev Runs this call's calldata in {extension} within this contract's storage and returns or reverts
    /// with its result (the stubs above name no parameters: the calldata is passed on as it came).
    function _delegate() private {
        _delegateTo(extension);
    }

    /// @dev {_delegate} to {roundsExtension}.
    function _delegateRounds() private {
        _delegateTo(roundsExtension);
    }

    function _delegateTo(address target) private {
        assembly ("memory-safe") {
            calldatacopy(0, 0, calldatasize())
            let ok := delegatecall(gas(), target, 0, calldatasize(), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
    }

    // ----------------------------------------------------------------------------------------------
    // Credits
    // ----------------------------------------------------------------------------------------------

    /// @notice Withdraws all of the caller's credit.
    function withdrawCredit() external nonReentrant {
        _withdrawCredit(msg.sender);
    }

    /// @notice Signed form of {withdrawCredit}; anyone may relay, the tokens go to `account`.
    function withdrawCreditWithSig(address account, uint256 nonce, uint256 deadline, bytes calldata signature)
        external
        nonReentrant
    {
        _useNonce(account, nonce);
        _checkSignature(
            account, keccak256(abi.encode(WITHDRAW_CREDIT_TYPEHASH, account, nonce, deadline)), deadline, signature
        );
        _withdrawCredit(account);
    }

    // ----------------------------------------------------------------------------------------------
    // Batching
    // ----------------------------------------------------------------------------------------------

    /// @notice Runs several calls of this contract in one transaction, each as if the caller sent it
    /// (same `msg.sender`, so role checks and caller-bound actions are unchanged); a failing call reverts
    /// everything with that call's revert data. Lets the operator pipeline units, e.g. reveal unit k,
    /// commit unit k+1 and assign unit k+2 in one transaction.
    /// @return results Each call's return data.
    function multicall(bytes[] calldata data) external returns (bytes[] memory results) {
        results = new bytes[](data.length);
        for (uint256 i; i < data.length; ++i) {
            (bool ok, bytes memory returned) = address(this).delegatecall(data[i]);
            if (!ok) {
                assembly ("memory-safe") {
                    revert(add(returned, 32), mload(returned))
                }
            }
            results[i] = returned;
        }
    }

    // ----------------------------------------------------------------------------------------------
    // Views
    // ----------------------------------------------------------------------------------------------

    /// @notice Withdrawable credit of `account`.
    function credits(address account) external view returns (uint256) {
        return _accounts[account].credit;
    }

    /// @notice Reputation counters of `account`.
    function reputationOf(address account)
        external
        view
        returns (uint64 valid, uint64 fault, uint64 fraud, uint64 consecutiveValid)
    {
        Account memory acc = _accounts[account];
        return (acc.valid, acc.fault, acc.fraud, acc.consecutiveValid);
    }

    /// @notice The order `orderId` (all fields zero if unknown).
    function getOrder(uint256 orderId) external view returns (Order memory) {
        return _orders[orderId];
    }

    /// @notice The unit `unitId` (state None if unknown).
    function getUnit(uint256 unitId) external view returns (UnitView memory) {
        Unit memory u = _units[unitId];
        return UnitView({
            orderId: u.orderId,
            state: u.state,
            replicas: u.replicas,
            verifierCount: u.verifierCount,
            committedMask: u.committedMask,
            revealedMask: u.revealedMask,
            drawn: u.drawn,
            commitDeadline: u.commitDeadline,
            revealDeadline: u.revealDeadline,
            verdictDeadline: u.state == UnitState.None ? 0 : _verdictDeadline(u)
        });
    }

    /// @notice Replica `index` of `unitId`: its provider, its commitment (before reveal) or result digest
    /// (after), and whether it committed and revealed.
    function replicaOf(uint256 unitId, uint256 index)
        external
        view
        returns (address provider, bytes32 commitmentOrDigest, bool committed, bool revealed)
    {
        Unit memory u = _units[unitId];
        if (index >= u.replicas) revert ReplicaIndexOutOfRange(unitId, index);
        return (
            _partyAt(unitId, index),
            u.state == UnitState.Finalized
                ? _digests[unitId][0]
                : u.state <= UnitState.Revealing ? _loadReplica(unitId, u.page, index) : _digests[unitId][index],
            u.committedMask & (1 << index) != 0,
            u.revealedMask & (1 << index) != 0
        );
    }

    /// @notice keccak256(abi.encodePacked(outcomes)) of the verdict that settled `unitId` (zero unless verdicted).
    function verdictHashOf(uint256 unitId) external view returns (bytes32) {
        return _verdictHashes[unitId];
    }

    /// @notice The verifiers assigned to `unitId`.
    function verifiersOf(uint256 unitId) external view returns (address[] memory verifiers) {
        return _verifiersAt(unitId, _units[unitId], type(uint256).max);
    }

    /// @notice The replicas of `unitId` a verdict called fraud that are still held for {settleHeld}, and
    /// when that verdict was recorded (0, 0 when nothing is held).
    function heldOf(uint256 unitId) external view returns (uint8 replicaMask, uint64 since) {
        uint256 held = _held[unitId];
        return (uint8(held), uint64(held >> 16));
    }

    /// @notice The commitment a provider must submit for `resultDigest` with secret `salt` on `unitId`.
    function commitmentOf(bytes32 resultDigest, bytes32 salt, address provider, uint256 unitId)
        external
        pure
        returns (bytes32)
    {
        return _commitmentOf(resultDigest, salt, provider, unitId);
    }

    /// @notice The key a round-path order's roster is accepted under (the `unitKey` of each provider's
    /// `Accept`): it binds the providers, their slots, the roster's shape and its verifiers. Without verifiers
    /// it is keccak256(abi.encode(providers, layout, replicas, unitsPerRound, rounds)), the key the roster is
    /// recorded by; with them, keccak256(abi.encode(that key, verifiers)).
    function rosterKey(
        address[] calldata providers,
        uint256 layout,
        uint8 replicas,
        uint32 unitsPerRound,
        uint32 rounds,
        address[] calldata verifiers
    ) external pure returns (bytes32) {
        return _acceptKey(_rosterKey(providers, layout, replicas, unitsPerRound, rounds), verifiers);
    }

    /// @notice A roster's audit state: its audit key, keccak256(keccak256(abi.encode(verifiers)), auditChain)
    /// (zero: no verifiers; see {RosterAudits}), and the verifiers whose collateral a slash's release freed.
    function rosterAuditsOf(uint256 orderId) external view returns (RosterAudits memory) {
        return _rosterAudits[orderId];
    }

    /// @notice The roster verifiers who signed the round audit of a unit set aside by {challengeAudit} (none
    /// for any other unit): VerdictAppeals slashes them when the unit's truth has fraud.
    function auditSignersOf(uint256 unitId) external view returns (address[] memory signers) {
        uint256 packed = _auditSigners[unitId];
        signers = new address[](packed >> 240);
        for (uint256 i; i < signers.length; ++i) {
            signers[i] = _partyAddresses[_idAt(packed, i)];
        }
    }

    /// @notice The unit id a round-path unit's commitments and `UnitCommit` signatures name ({commitmentOf}):
    /// a hash, so it never equals a sequential per-unit id and each (order, round, unit) is its own.
    function roundUnitId(uint256 orderId, uint256 round, uint256 unit) external pure returns (uint256) {
        return _roundUnitId(orderId, round, unit);
    }

    /// @notice The roster of a round-path order (all zero if none) and the chained hash of its pending
    /// round's commitments.
    function getRoster(uint256 orderId) external view returns (Roster memory roster, bytes32 pendingRoundHash) {
        return (_rosters[orderId], _roundHashes[orderId]);
    }

    /// @notice Tokens escrowed for orders (order balances plus the cost of open units).
    function totalEscrow() external view returns (uint256) {
        return _totals.escrow;
    }

    /// @notice Sum of all withdrawable credits.
    function totalCredits() external view returns (uint256) {
        return _totals.credits;
    }

    /// @notice Number of orders posted (the last order id).
    function orderCount() external view returns (uint256) {
        return _orderCount;
    }

    /// @notice Number of units assigned (the last unit id).
    function unitCount() external view returns (uint256) {
        return _unitCounter.count;
    }

    /// @notice The market parameters.
    function params() external view returns (Params memory) {
        return Params({
            commitWindow: _commitWindow,
            revealWindow: _revealWindow,
            verdictWindow: _verdictWindow,
            minVerifiers: _minVerifiers,
            bountyBps: _bountyBps,
            providerCollateral: _providerCollateral,
            slashAmount: _slashAmount,
            verifierCollateral: _verifierCollateral,
            spotCheckPpm: _spotCheckPpm,
            soloSpotCheckPpm: _soloSpotCheckPpm,
            withholdPenalty: _withholdPenalty,
            probationStreak: _probationStreak
        });
    }

}
