// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {JobMarket, JobMarketBase} from "./JobMarket.sol";
import {StakeManager} from "./StakeManager.sol";

/// @title VerdictAppeals
/// @notice Referees a verdict that a unit's verifier majority settled on {JobMarket}, so a colluding
/// majority loses instead of deciding. It is also the only way to slash a verifier for signing outcomes
/// that contradict a unit's truth, and the truth is fixed only by a referee decision:
/// - no appeal within `appealWindow` after the unit's verdict deadline: the verdict is the truth;
/// - an appeal (anyone; `appealBond` of the appellant's free stake is locked) draws a panel of
///   `panelSize` referees from the referee pool, by the hash of the appeal's block (read in a later
///   block, so nobody knows it when appealing), excluding the unit's providers, its verifiers and the
///   appellant. Referees re-execute the unit and sign `RefereeVote` outcomes; `panelSize / 2 + 1` equal
///   votes before `voteWindow` after the appeal decide, and the decision is the truth:
///   - it equals the verdict (confirmed): the appellant's bond is slashed to the referees who voted it;
///   - it differs (overturned): the bond is released, and every provider the panel judges fraud that
///     the verdict did not (accepted or called a fault) loses JobMarket's `slashAmount` (`bountyBps` to
///     the deciding referees, the rest to the buyer).
/// - no decision by the vote deadline (lapsed): the bond is released and the unit has no truth, so
///   nobody can be slashed for contradicting it.
/// The replicas a verdict calls fraud are held by JobMarket (collateral locked, price in escrow, no slash,
/// no bounty) until the truth is fixed, then settled by it: by {settleVerdict} once the verdict stands
/// (nobody appealed within `appealWindow` of the verdict, or its appeal lapsed) and by {resolve} for a
/// decided appeal. So a colluding majority that frames an honest replica gains nothing before the honest
/// minority's appeal is decided; an appeal filed later than that still slashes the verifiers who signed
/// an overturned verdict, but no longer moves the held money.
/// Once the truth is fixed, anyone presenting an assigned verifier's JobMarket `Verdict` signature over
/// other outcomes slashes it `verifierSlash`, once per unit ({slashContradiction}; `bountyBps` to the
/// reporter, the rest to the buyer): the verifiers who signed an overturned verdict, and a minority
/// that contradicted a verdict it did not appeal or that the panel confirmed.
///
/// The referee pool: a staker joins by locking `refereeStake` ({joinPool}), one entry per account, so
/// the draw is weighted by stake locked in the pool. Entries are append-only (leaving marks the entry),
/// and an appeal records the pool's length and its block, so joining or leaving after the appeal cannot
/// change whom its seed draws. When the seed block's hash is no longer readable (256 blocks), the next
/// {drawPanel} re-seeds from its own block instead of drawing.
///
/// @dev Slashed tokens pass through this contract in the same transaction (it holds none). Timing:
/// `commitWindow + revealWindow + verdictWindow + appealWindow + voteWindow < unbondingPeriod` (checked at
/// deployment): a verdict can land right after assignment while the appeal window runs from the verdict
/// deadline, fixed at assignment, so a verifier or provider that starts unstaking when the unit settles
/// is still slashable when the appeal is decided; relaying the slashes must follow within the rest of
/// the unbonding period.
/// EIP-712 domain ("Veritrain VerdictAppeals", "1", chainId, this):
/// `RefereeVote(uint256 unitId,bytes32 outcomesHash,uint256 deadline)`, outcomesHash as in JobMarket's
/// `Verdict`. No nonce: a referee votes once per appeal and a unit has at most one appeal.
contract VerdictAppeals is EIP712, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    /// @notice Appeal parameters, fixed at deployment (seconds, base units).
    struct Params {
        uint64 appealWindow;
        uint64 voteWindow;
        uint8 panelSize;
        uint16 bountyBps;
        uint256 appealBond;
        uint256 refereeStake;
        uint256 verifierSlash;
    }

    /// @notice A referee's signed vote (EIP-712 `RefereeVote`), relayed by anyone.
    struct RefereeSignature {
        address referee;
        uint256 deadline;
        bytes signature;
    }

    /// @notice Life cycle of a unit's appeal.
    enum AppealState {
        None,
        Pending,
        Confirmed,
        Overturned,
        Lapsed
    }

    /// @notice Read-only view of an appeal.
    struct AppealView {
        AppealState state;
        address appellant;
        uint64 voteDeadline;
        uint64 seedBlock;
        uint64 poolSize;
        bytes32 decided;
        address[] panel;
        bytes32[] votes;
    }

    struct Appeal {
        address appellant;
        uint64 voteDeadline;
        AppealState state;
        uint64 seedBlock;
        uint64 poolSize;
        bytes32 decided;
        address[] panel;
        bytes32[] votes;
    }

    struct PoolEntry {
        address referee;
        uint64 leftBlock;
    }

    /// @notice Most referees on a panel.
    uint256 public constant MAX_PANEL = 7;
    uint8 private constant OUTCOME_FAULT = 1;
    uint8 private constant OUTCOME_FRAUD = 2;
    uint256 private constant BPS = 10_000;
    /// @dev Draw attempts per seat before the draw gives up (tombstones and excluded parties are skipped).
    uint256 private constant DRAW_TRIES_PER_SEAT = 16;
    bytes32 private constant REFEREE_VOTE_TYPEHASH =
        keccak256("RefereeVote(uint256 unitId,bytes32 outcomesHash,uint256 deadline)");
    bytes32 private constant VERDICT_TYPEHASH = keccak256("Verdict(uint256 unitId,bytes32 outcomesHash,uint256 deadline)");
    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");

    /// @notice The market whose verdicts are refereed.
    JobMarket public immutable market;
    /// @notice The stake registry (this contract needs its MARKET_ROLE).
    StakeManager public immutable stakes;
    /// @notice The stake token.
    IERC20 public immutable token;

    uint64 private immutable _appealWindow;
    uint64 private immutable _voteWindow;
    uint8 private immutable _panelSize;
    uint16 private immutable _bountyBps;
    uint256 private immutable _appealBond;
    uint256 private immutable _refereeStake;
    uint256 private immutable _verifierSlash;
    /// @dev JobMarket's EIP-712 domain separator, for its verifiers' `Verdict` signatures.
    bytes32 private immutable _marketDomain;

    mapping(uint256 unitId => Appeal) private _appeals;
    PoolEntry[] private _pool;
    /// @dev 1 + the index of an account's active pool entry; 0 when it is not in the pool.
    mapping(address account => uint256) private _entryOf;
    /// @dev Verifier positions (bit i: verifier i) already slashed for contradicting a unit's truth.
    mapping(uint256 unitId => uint256) private _slashedVerifiers;

    /// @notice A constructor argument is unusable.
    error InvalidParameter(string name);
    /// @notice The unit was not settled by a verdict.
    error NoVerdict(uint256 unitId);
    /// @notice Appeals of this unit closed at `deadline`.
    error AppealWindowClosed(uint256 unitId, uint256 deadline);
    /// @notice The unit already has an appeal.
    error AlreadyAppealed(uint256 unitId);
    /// @notice The unit has no pending appeal.
    error NoPendingAppeal(uint256 unitId);
    /// @notice The panel is drawn from the hash of `seedBlock`, readable from the next block on.
    error DrawTooEarly(uint256 unitId, uint256 seedBlock);
    /// @notice The appeal's panel was already drawn.
    error PanelAlreadyDrawn(uint256 unitId);
    /// @notice The pool has too few eligible referees for a panel.
    error PanelUndrawable(uint256 unitId, uint256 drawn);
    /// @notice The appeal's panel is not drawn yet.
    error PanelNotDrawn(uint256 unitId);
    /// @notice Votes on this appeal closed at `deadline`.
    error VoteWindowClosed(uint256 unitId, uint256 deadline);
    /// @notice `referee` does not sit on the unit's panel.
    error NotOnPanel(uint256 unitId, address referee);
    /// @notice `referee` already voted on this appeal.
    error AlreadyVoted(uint256 unitId, address referee);
    /// @notice A vector needs one outcome per replica.
    error OutcomeCountMismatch(uint256 expected, uint256 given);
    /// @notice Outcome at `index` is unknown, or accept/fraud for a replica that never revealed.
    error InvalidOutcome(uint256 index, uint8 outcome);
    /// @notice The outcomes given do not hash to the verdict, or to the panel's decision.
    error OutcomesMismatch(uint256 unitId, bytes32 expected, bytes32 given);
    /// @notice A majority of the panel already decided; later votes change nothing.
    error AlreadyDecided(uint256 unitId);
    /// @notice The panel has not decided yet.
    error NotDecided(uint256 unitId);
    /// @notice The appeal can lapse only after its vote deadline without a decision.
    error AppealNotLapsed(uint256 unitId, uint256 voteDeadline);
    /// @notice The unit's truth is not fixed yet: its appeal window is open or its appeal undecided.
    error TruthNotFixed(uint256 unitId);
    /// @notice The unit's appeal lapsed: nobody can be slashed for contradicting it.
    error AppealLapsed(uint256 unitId);
    /// @notice `account` is not one of the unit's verifiers.
    error NotAssignedVerifier(uint256 unitId, address account);
    /// @notice The verifier's signed outcomes equal the unit's truth.
    error VerdictNotContradicted(uint256 unitId, address verifier);
    /// @notice The verifier was already slashed for contradicting this unit.
    error VerifierAlreadySlashed(uint256 unitId, address verifier);
    /// @notice The unit's truth has no fraud, so the signers of its round audit told the truth.
    error AuditNotContradicted(uint256 unitId);
    /// @notice The account already has an active pool entry.
    error AlreadyInPool(address account);
    /// @notice The account has no active pool entry.
    error NotInPool(address account);
    /// @notice The recovered signer differs from the expected party (zero for a malformed signature).
    error InvalidSigner(address expected, address recovered);
    /// @notice The signature's deadline has passed.
    error SignatureExpired(uint256 deadline, uint256 now);

    /// @notice `account` joined the referee pool as entry `index`.
    event RefereeJoined(address indexed account, uint256 index);
    /// @notice `account` left the referee pool.
    event RefereeLeft(address indexed account, uint256 index);
    /// @notice `appellant` appealed the verdict of `unitId`; the panel is drawn from `seedBlock`'s hash.
    event AppealFiled(uint256 indexed unitId, address indexed appellant, uint256 seedBlock, uint64 voteDeadline);
    /// @notice The seed block's hash expired before the draw; the panel is drawn from `seedBlock` instead.
    event AppealReseeded(uint256 indexed unitId, uint256 seedBlock);
    /// @notice The unit's referee panel was drawn.
    event PanelDrawn(uint256 indexed unitId, address[] panel);
    /// @notice A referee voted `outcomesHash` on the unit's appeal.
    event RefereeVoted(uint256 indexed unitId, address indexed referee, bytes32 outcomesHash);
    /// @notice A majority of the panel voted `outcomes`; `overturned` when they differ from the verdict.
    event AppealDecided(uint256 indexed unitId, uint8[] outcomes, bytes32 outcomesHash, bool overturned);
    /// @notice The decision's stakes moved: the bond (confirmed) or fraud slashes (overturned).
    event AppealResolved(uint256 indexed unitId, bool overturned, uint256 slashed);
    /// @notice Nobody decided the appeal by its deadline; the bond was released.
    event AppealLapsedEvent(uint256 indexed unitId);
    /// @notice An assigned verifier whose signed outcomes contradict the unit's truth lost `amount` of
    /// stake; `reporter` presented the signature and earned the bounty.
    event VerifierSlashed(uint256 indexed unitId, address indexed verifier, uint256 amount, address reporter);

    /// @param market_ The JobMarket whose verdicts are appealed.
    /// @param params_ 0 < windows, the market's windows `+ appealWindow + voteWindow < unbondingPeriod`,
    /// panelSize odd in 1..MAX_PANEL, bountyBps <= 100 %, refereeStake > 0.
    constructor(JobMarket market_, Params memory params_) EIP712("Veritrain VerdictAppeals", "1") {
        if (address(market_) == address(0)) revert InvalidParameter("market");
        StakeManager stakes_ = market_.stakes();
        if (params_.appealWindow == 0) revert InvalidParameter("appealWindow");
        if (params_.voteWindow == 0) revert InvalidParameter("voteWindow");
        JobMarketBase.Params memory windows = market_.params();
        uint256 settleBy = uint256(windows.commitWindow) + windows.revealWindow + windows.verdictWindow
            + params_.appealWindow + params_.voteWindow;
        if (settleBy >= stakes_.unbondingPeriod()) revert InvalidParameter("unbondingPeriod");
        if (params_.panelSize == 0 || params_.panelSize > MAX_PANEL || params_.panelSize % 2 == 0) {
            revert InvalidParameter("panelSize");
        }
        if (params_.bountyBps > BPS) revert InvalidParameter("bountyBps");
        if (params_.refereeStake == 0) revert InvalidParameter("refereeStake");
        market = market_;
        stakes = stakes_;
        token = market_.token();
        _appealWindow = params_.appealWindow;
        _voteWindow = params_.voteWindow;
        _panelSize = params_.panelSize;
        _bountyBps = params_.bountyBps;
        _appealBond = params_.appealBond;
        _refereeStake = params_.refereeStake;
        _verifierSlash = params_.verifierSlash;
        _marketDomain = keccak256(
            abi.encode(
                DOMAIN_TYPEHASH, keccak256("Veritrain JobMarket"), keccak256("1"), block.chainid, address(market_)
            )
        );
    }

    // ----------------------------------------------------------------------------------------------
    // Referee pool
    // ----------------------------------------------------------------------------------------------

    /// @notice Joins the referee pool, locking `refereeStake` of the caller's free stake.
    function joinPool() external {
        if (_entryOf[msg.sender] != 0) revert AlreadyInPool(msg.sender);
        stakes.lock(msg.sender, _refereeStake);
        _pool.push(PoolEntry({referee: msg.sender, leftBlock: 0}));
        _entryOf[msg.sender] = _pool.length;
        emit RefereeJoined(msg.sender, _pool.length - 1);
    }

    /// @notice Leaves the pool and releases the referee stake. A panel already drawn keeps its seat.
    function leavePool() external {
        uint256 entry = _entryOf[msg.sender];
        if (entry == 0) revert NotInPool(msg.sender);
        delete _entryOf[msg.sender];
        _pool[entry - 1].leftBlock = uint64(block.number);
        stakes.unlock(msg.sender, _refereeStake);
        emit RefereeLeft(msg.sender, entry - 1);
    }

    // ----------------------------------------------------------------------------------------------
    // Appeals
    // ----------------------------------------------------------------------------------------------

    /// @notice Appeals the verdict that settled `unitId`, locking `appealBond` of the caller's free stake
    /// until the appeal is decided or lapses. Open until `appealWindow` after the unit's verdict deadline.
    function appeal(uint256 unitId) external nonReentrant {
        JobMarketBase.UnitView memory u = market.getUnit(unitId);
        if (u.state != JobMarketBase.UnitState.Verdicted) revert NoVerdict(unitId);
        uint256 closes = u.verdictDeadline + _appealWindow;
        if (block.timestamp > closes) revert AppealWindowClosed(unitId, closes);
        Appeal storage a = _appeals[unitId];
        if (a.state != AppealState.None) revert AlreadyAppealed(unitId);
        a.state = AppealState.Pending;
        a.appellant = msg.sender;
        a.voteDeadline = uint64(block.timestamp + _voteWindow);
        a.seedBlock = uint64(block.number);
        a.poolSize = uint64(_pool.length);
        stakes.lock(msg.sender, _appealBond);
        emit AppealFiled(unitId, msg.sender, block.number, a.voteDeadline);
    }

    /// @notice Draws the unit's panel from the hash of the appeal's seed block (permissionless, from the
    /// next block on). Re-seeds instead when that hash is no longer readable.
    function drawPanel(uint256 unitId) external {
        Appeal storage a = _requirePending(unitId);
        if (a.panel.length != 0) revert PanelAlreadyDrawn(unitId);
        if (block.timestamp > a.voteDeadline) revert VoteWindowClosed(unitId, a.voteDeadline);
        uint256 seedBlock = a.seedBlock;
        if (block.number <= seedBlock) revert DrawTooEarly(unitId, seedBlock);
        bytes32 seed = blockhash(seedBlock);
        if (seed == 0) {
            a.seedBlock = uint64(block.number);
            a.poolSize = uint64(_pool.length);
            emit AppealReseeded(unitId, block.number);
            return;
        }
        address[] memory excluded = _partiesOf(unitId, a.appellant);
        address[] memory panel = new address[](_panelSize);
        uint256 drawn;
        uint256 size = a.poolSize;
        for (uint256 attempt; size != 0 && attempt < _panelSize * DRAW_TRIES_PER_SEAT && drawn < _panelSize; ++attempt) {
            PoolEntry memory entry = _pool[uint256(keccak256(abi.encode(seed, unitId, attempt))) % size];
            if (entry.leftBlock != 0 && entry.leftBlock <= seedBlock) continue;
            if (_contains(excluded, excluded.length, entry.referee) || _contains(panel, drawn, entry.referee)) continue;
            panel[drawn++] = entry.referee;
        }
        if (drawn < _panelSize) revert PanelUndrawable(unitId, drawn);
        a.panel = panel;
        a.votes = new bytes32[](_panelSize);
        emit PanelDrawn(unitId, panel);
    }

    /// @notice Records a referee's signed vote (relayed by anyone). The vote that gives one outcome vector
    /// `panelSize / 2 + 1` votes decides the appeal.
    function vote(uint256 unitId, uint8[] calldata outcomes, RefereeSignature calldata sig) external {
        Appeal storage a = _requirePending(unitId);
        uint256 seats = a.panel.length;
        if (seats == 0) revert PanelNotDrawn(unitId);
        if (block.timestamp > a.voteDeadline) revert VoteWindowClosed(unitId, a.voteDeadline);
        if (a.decided != 0) revert AlreadyDecided(unitId);
        uint256 seat;
        while (seat < seats && a.panel[seat] != sig.referee) ++seat;
        if (seat == seats) revert NotOnPanel(unitId, sig.referee);
        if (a.votes[seat] != 0) revert AlreadyVoted(unitId, sig.referee);
        bytes32 outcomesHash = _checkOutcomes(market.getUnit(unitId), outcomes);
        if (block.timestamp > sig.deadline) revert SignatureExpired(sig.deadline, block.timestamp);
        bytes32 digest = _hashTypedDataV4(keccak256(abi.encode(REFEREE_VOTE_TYPEHASH, unitId, outcomesHash, sig.deadline)));
        _requireSigner(sig.referee, digest, sig.signature);
        a.votes[seat] = outcomesHash;
        emit RefereeVoted(unitId, sig.referee, outcomesHash);
        uint256 count;
        for (uint256 i; i < seats; ++i) {
            if (a.votes[i] == outcomesHash) ++count;
        }
        if (count == seats / 2 + 1) {
            a.decided = outcomesHash;
            emit AppealDecided(unitId, outcomes, outcomesHash, outcomesHash != market.verdictHashOf(unitId));
        }
    }

    /// @notice Moves the stakes of a decided appeal (permissionless): `verdict` must be the outcomes that
    /// settled the unit and `decided` the panel's. The replicas the verdict called fraud are settled by the
    /// decision ({JobMarket-settleHeld}). Confirmed: the appellant's bond goes to the referees who voted the
    /// decision. Overturned: the bond is released and every provider the panel judges fraud is slashed
    /// JobMarket's `slashAmount` by JobMarket ({JobMarket-settleHeld}: the held ones and those the verdict
    /// missed, through its own collateral locks), the stake coming here: `bountyBps` to the deciding
    /// referees, the rest to the buyer.
    function resolve(uint256 unitId, uint8[] calldata verdict, uint8[] calldata decided) external nonReentrant {
        Appeal storage a = _requirePending(unitId);
        bytes32 decidedHash = a.decided;
        if (decidedHash == 0) revert NotDecided(unitId);
        _requireHash(unitId, decidedHash, decided);
        bytes32 verdictHash = market.verdictHashOf(unitId);
        _requireHash(unitId, verdictHash, verdict);
        address[] memory winners = _votersOf(a, decidedHash);
        address appellant = a.appellant;
        stakes.unlock(appellant, _appealBond);
        uint256 slashed;
        address buyer = market.getOrder(market.getUnit(unitId).orderId).buyer;
        if (decidedHash == verdictHash) {
            a.state = AppealState.Confirmed;
            market.settleHeld(unitId, verdict, decided);
            slashed = stakes.slash(appellant, _appealBond, address(this));
            _pay(winners, slashed, buyer);
        } else {
            a.state = AppealState.Overturned;
            slashed = market.settleHeld(unitId, verdict, decided); // every replica the decision calls fraud
            uint256 bounty = (slashed * _bountyBps) / BPS;
            _pay(winners, bounty, buyer);
            if (slashed != bounty) token.safeTransfer(buyer, slashed - bounty);
        }
        emit AppealResolved(unitId, decidedHash != verdictHash, slashed);
    }

    /// @notice Settles the replicas the unit's verdict called fraud by the verdict itself
    /// ({JobMarket-settleHeld}) once nobody appealed within `appealWindow` of the verdict, or its appeal
    /// lapsed (no truth, so the verdict stands). The hold's window starts at the verdict, not at the unit's
    /// verdict deadline (which only bounds when an appeal may still slash verifiers), so held money waits no
    /// longer than an honest minority needs to appeal. Permissionless; a no-op when nothing is held or a
    /// decided appeal's {resolve} settled it. `verdict`: the outcomes that settled the unit.
    function settleVerdict(uint256 unitId, uint8[] calldata verdict) external nonReentrant {
        _requireHash(unitId, market.verdictHashOf(unitId), verdict);
        AppealState state = _appeals[unitId].state;
        if (state == AppealState.Pending) revert TruthNotFixed(unitId);
        if (state == AppealState.Confirmed || state == AppealState.Overturned) return;
        if (state == AppealState.None) {
            (, uint64 since) = market.heldOf(unitId);
            if (block.timestamp <= since + _appealWindow) revert TruthNotFixed(unitId);
        }
        market.settleHeld(unitId, verdict, verdict);
    }

    /// @notice Closes an appeal that no majority decided by its vote deadline: the bond is released and
    /// the unit has no truth (nobody is slashed for it). Permissionless.
    function lapse(uint256 unitId) external {
        Appeal storage a = _requirePending(unitId);
        if (a.decided != 0 || block.timestamp <= a.voteDeadline) revert AppealNotLapsed(unitId, a.voteDeadline);
        a.state = AppealState.Lapsed;
        stakes.unlock(a.appellant, _appealBond);
        emit AppealLapsedEvent(unitId);
    }

    /// @notice Slashes `verifierSlash` from an assigned verifier of `unitId` whose own JobMarket `Verdict`
    /// signature (`signature.deadline` as signed; it need not still be valid) covers outcomes other than
    /// the unit's truth (see the contract notice). Permissionless: the caller gets `bountyBps` of the
    /// slash, the buyer the rest. Once per verifier and unit.
    function slashContradiction(
        uint256 unitId,
        uint8[] calldata outcomes,
        JobMarketBase.VerifierSignature calldata signature
    ) external nonReentrant returns (uint256 slashed) {
        bytes32 truth = truthOf(unitId);
        address verifier = signature.verifier;
        address[] memory verifiers = market.verifiersOf(unitId);
        uint256 index;
        while (index < verifiers.length && verifiers[index] != verifier) ++index;
        if (index == verifiers.length) revert NotAssignedVerifier(unitId, verifier);
        bytes32 outcomesHash = keccak256(abi.encodePacked(outcomes));
        if (outcomesHash == truth) revert VerdictNotContradicted(unitId, verifier);
        bytes32 structHash = keccak256(abi.encode(VERDICT_TYPEHASH, unitId, outcomesHash, signature.deadline));
        _requireSigner(verifier, MessageHashUtils.toTypedDataHash(_marketDomain, structHash), signature.signature);
        uint256 mask = _slashedVerifiers[unitId];
        if (mask & (1 << index) != 0) revert VerifierAlreadySlashed(unitId, verifier);
        _slashedVerifiers[unitId] = mask | (1 << index);
        slashed = stakes.slash(verifier, _verifierSlash, address(this));
        uint256 bounty = (slashed * _bountyBps) / BPS;
        if (bounty != 0) token.safeTransfer(msg.sender, bounty);
        if (slashed != bounty) {
            token.safeTransfer(market.getOrder(market.getUnit(unitId).orderId).buyer, slashed - bounty);
        }
        emit VerifierSlashed(unitId, verifier, slashed, msg.sender);
    }

    /// @notice Slashes `verifierSlash` from each roster verifier that signed the round audit of `unitId` (a
    /// unit the operator set aside by challenging that audit, {JobMarket-challengeAudit}; its signers are
    /// {JobMarket-auditSignersOf}, recorded when the step checked their `RoundAudit` signatures) once the
    /// unit's truth is fixed and calls a replica fraud: the audit attested the replicas' agreed digest.
    /// `truth`: the unit's truth ({truthOf}). Permissionless, `bountyBps` to the caller and the rest to the
    /// buyer, as {slashContradiction}; once per signer and unit (even if it also signed the unit's verdict).
    function slashRoundAudit(uint256 unitId, uint8[] calldata truth) external nonReentrant returns (uint256 slashed) {
        _requireHash(unitId, truthOf(unitId), truth);
        uint256 i;
        while (i < truth.length && truth[i] != OUTCOME_FRAUD) ++i;
        if (i == truth.length) revert AuditNotContradicted(unitId);
        address[] memory signers = market.auditSignersOf(unitId);
        uint256 before = _slashedVerifiers[unitId];
        uint256 mask = before;
        market.releaseAuditSigners(unitId); // their roster collateral first, while the roster holds it
        for (uint256 s; s < signers.length; ++s) {
            uint256 bit = 1 << (8 + s); // bits 0..7: the unit's verdict verifiers ({slashContradiction})
            if (mask & bit != 0) continue;
            mask |= bit;
            uint256 taken = stakes.slash(signers[s], _verifierSlash, address(this));
            slashed += taken;
            emit VerifierSlashed(unitId, signers[s], taken, msg.sender);
        }
        if (mask == before) revert VerifierAlreadySlashed(unitId, address(0));
        _slashedVerifiers[unitId] = mask;
        uint256 bounty = (slashed * _bountyBps) / BPS;
        if (bounty != 0) token.safeTransfer(msg.sender, bounty);
        if (slashed != bounty) {
            token.safeTransfer(market.getOrder(market.getUnit(unitId).orderId).buyer, slashed - bounty);
        }
    }

    // ----------------------------------------------------------------------------------------------
    // Views
    // ----------------------------------------------------------------------------------------------

    /// @notice The outcomes hash that verifiers of `unitId` are judged against; reverts while none is
    /// fixed ({TruthNotFixed}) or when the appeal lapsed ({AppealLapsed}).
    function truthOf(uint256 unitId) public view returns (bytes32) {
        Appeal storage a = _appeals[unitId];
        AppealState state = a.state;
        if (state == AppealState.Confirmed || state == AppealState.Overturned) return a.decided;
        if (state == AppealState.Lapsed) revert AppealLapsed(unitId);
        if (state == AppealState.Pending) revert TruthNotFixed(unitId);
        JobMarketBase.UnitView memory u = market.getUnit(unitId);
        if (u.state != JobMarketBase.UnitState.Verdicted) revert NoVerdict(unitId);
        if (block.timestamp <= u.verdictDeadline + _appealWindow) revert TruthNotFixed(unitId);
        return market.verdictHashOf(unitId);
    }

    /// @notice The appeal of `unitId` (state None if there is none).
    function getAppeal(uint256 unitId) external view returns (AppealView memory) {
        Appeal storage a = _appeals[unitId];
        return AppealView({
            state: a.state,
            appellant: a.appellant,
            voteDeadline: a.voteDeadline,
            seedBlock: a.seedBlock,
            poolSize: a.poolSize,
            decided: a.decided,
            panel: a.panel,
            votes: a.votes
        });
    }

    /// @notice Number of pool entries ever made (left entries included).
    function poolLength() external view returns (uint256) {
        return _pool.length;
    }

    /// @notice Whether `account` is in the referee pool now.
    function inPool(address account) external view returns (bool) {
        return _entryOf[account] != 0;
    }

    /// @notice The appeal parameters.
    function params() external view returns (Params memory) {
        return Params({
            appealWindow: _appealWindow,
            voteWindow: _voteWindow,
            panelSize: _panelSize,
            bountyBps: _bountyBps,
            appealBond: _appealBond,
            refereeStake: _refereeStake,
            verifierSlash: _verifierSlash
        });
    }

    // ----------------------------------------------------------------------------------------------
    // Internals
    // ----------------------------------------------------------------------------------------------

    function _requirePending(uint256 unitId) private view returns (Appeal storage a) {
        a = _appeals[unitId];
        if (a.state != AppealState.Pending) revert NoPendingAppeal(unitId);
    }

    function _requireHash(uint256 unitId, bytes32 expected, uint8[] calldata outcomes) private pure {
        bytes32 given = keccak256(abi.encodePacked(outcomes));
        if (given != expected) revert OutcomesMismatch(unitId, expected, given);
    }

    function _requireSigner(address expected, bytes32 digest, bytes calldata signature) private pure {
        (address recovered,,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (recovered == address(0) || recovered != expected) revert InvalidSigner(expected, recovered);
    }

    /// @dev One known outcome per replica, accept and fraud only for revealed replicas (as JobMarket).
    function _checkOutcomes(JobMarketBase.UnitView memory u, uint8[] calldata outcomes) private pure returns (bytes32) {
        if (outcomes.length != u.replicas) revert OutcomeCountMismatch(u.replicas, outcomes.length);
        for (uint256 i; i < outcomes.length; ++i) {
            uint8 outcome = outcomes[i];
            bool revealed = u.revealedMask & (1 << i) != 0;
            if (outcome > OUTCOME_FRAUD || (outcome != OUTCOME_FAULT && !revealed)) revert InvalidOutcome(i, outcome);
        }
        return keccak256(abi.encodePacked(outcomes));
    }

    /// @dev The unit's providers and verifiers and the appellant: nobody with a stake in the verdict referees it.
    function _partiesOf(uint256 unitId, address appellant) private view returns (address[] memory parties) {
        uint256 replicas = market.getUnit(unitId).replicas;
        address[] memory verifiers = market.verifiersOf(unitId);
        parties = new address[](replicas + verifiers.length + 1);
        for (uint256 i; i < replicas; ++i) {
            (parties[i],,,) = market.replicaOf(unitId, i);
        }
        for (uint256 i; i < verifiers.length; ++i) {
            parties[replicas + i] = verifiers[i];
        }
        parties[parties.length - 1] = appellant;
    }

    function _contains(address[] memory list, uint256 count, address account) private pure returns (bool) {
        for (uint256 i; i < count; ++i) {
            if (list[i] == account) return true;
        }
        return false;
    }

    /// @dev The referees who voted `outcomesHash`.
    function _votersOf(Appeal storage a, bytes32 outcomesHash) private view returns (address[] memory voters) {
        uint256 seats = a.panel.length;
        voters = new address[](seats);
        uint256 count;
        for (uint256 i; i < seats; ++i) {
            if (a.votes[i] == outcomesHash) voters[count++] = a.panel[i];
        }
        assembly ("memory-safe") {
            mstore(voters, count)
        }
    }

    /// @dev Splits `amount` (held by this contract) evenly among `referees`; the rounding dust goes to `buyer`.
    function _pay(address[] memory referees, uint256 amount, address buyer) private {
        uint256 share = amount / referees.length;
        for (uint256 i; i < referees.length; ++i) {
            if (share != 0) token.safeTransfer(referees[i], share);
        }
        uint256 dust = amount - share * referees.length;
        if (dust != 0) token.safeTransfer(buyer, dust);
    }
}
