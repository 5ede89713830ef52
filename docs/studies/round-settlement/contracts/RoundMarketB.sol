// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {RoundBase} from "./RoundBase.sol";
import {RoundStake} from "./RoundStake.sol";

/// THROWAWAY PROTOTYPE. Design B, "optimistic round": the bonded operator posts one transaction per round
/// carrying round r's leaves (provider index, commitment) and their RoundWork signatures in calldata,
/// verifying NO signature, and round r-1's openings (checked on chain against r-1's stored hash, units
/// drawn from r-1's post block). The stored hash binds the signatures, so within `window` of the post
/// anyone can prove a bad one ({challengeSignature}): the round's payouts are voided and the operator's
/// bond slashed. Payouts go to a per-provider pending slot of two epoch buckets (epoch = window seconds)
/// and become withdrawable two epochs later, after every round they came from is past its window.
/// Round records live in a ring of `ring` slot pairs, reused once their window passed (steady state:
/// overwrites, not fresh slots).
contract RoundMarketB is RoundBase {
    using SafeERC20 for IERC20;

    struct Leaf {
        uint256 p;
        bytes32 commitment;
    }

    struct Rec {
        uint64 orderId;
        uint16 round;
        uint40 postedAt;
        uint48 seedBlock;
        uint8 status;
        uint32 paidMask;
        uint32 revealEpoch;
    }

    /// Two epoch buckets of not-yet-withdrawable pay (amount, epoch, replica count).
    struct Pending {
        uint88 amountA;
        uint24 epochA;
        uint16 unitsA;
        uint88 amountB;
        uint24 epochB;
        uint16 unitsB;
    }

    uint8 internal constant POSTED = 1;
    uint8 internal constant REVEALED = 2;
    uint8 internal constant VOIDED = 3;

    uint256 public immutable ring;
    uint64 public immutable window;
    uint256 public immutable minBond;
    uint256 public immutable slashAmount;

    uint256 public operatorBond;
    uint256 public compensationPool;
    mapping(uint256 => bytes32) public ringHash;
    mapping(uint256 => Rec) public ringRec;
    mapping(address => Pending) public pendingOf;

    error RingBusy();
    error SignatureValid();
    error WindowClosed();
    error NoBond();

    constructor(
        IERC20 token_,
        RoundStake stakes_,
        address operator_,
        uint256 collateral_,
        uint32 spotPpm_,
        uint32 soloPpm_,
        bool checkStake_,
        uint256 ring_,
        uint64 window_,
        uint256 minBond_,
        uint256 slashAmount_
    ) RoundBase("Veritrain RoundMarketB", token_, stakes_, operator_, collateral_, spotPpm_, soloPpm_, checkStake_) {
        ring = ring_;
        window = window_;
        minBond = minBond_;
        slashAmount = slashAmount_;
    }

    function bond(uint256 amount) external onlyOperator {
        operatorBond += amount;
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// Reveals round `round - 1` (if any) with `prevAux` = keccak(sigsHash, deadline) of its post, then posts
    /// round `round`'s leaves and signatures unverified.
    function postRound(
        uint256 orderId,
        uint256 round,
        address[] calldata prevProviders,
        Opening[] calldata prevOps,
        bytes32 prevAux,
        uint256 deadline,
        address[] calldata providers,
        Leaf[] calldata leaves,
        bytes32[] calldata sigs
    ) external onlyOperator {
        if (operatorBond < minBond) revert NoBond();
        (Order memory o, OrderState memory s) = _openRound(orderId, round);
        if (round > 0) {
            _reveal(orderId, round - 1, o, s, prevProviders, prevOps, prevAux);
        } else if (s.pending != 0) {
            revert BadRound();
        }
        _post(orderId, round, o, s, deadline, providers, leaves, sigs);
        _states[orderId] = s;
    }

    /// Reveals the order's last posted round (permissionless: the openings are the authorization).
    function revealLast(
        uint256 orderId,
        uint256 round,
        address[] calldata providers,
        Opening[] calldata ops,
        bytes32 aux
    ) external {
        Order memory o = _orders[orderId];
        OrderState memory s = _states[orderId];
        if (round + 1 != s.committed) revert BadRound();
        _reveal(orderId, round, o, s, providers, ops, aux);
        _states[orderId] = s;
    }

    function withdraw() external override {
        Pending memory b = pendingOf[msg.sender];
        uint256 epoch = block.timestamp / window;
        bool changed;
        if (b.amountA != 0 && uint256(b.epochA) + 2 <= epoch) {
            _fold(msg.sender, b.amountA, b.unitsA);
            b.amountA = 0;
            b.unitsA = 0;
            changed = true;
        }
        if (b.amountB != 0 && uint256(b.epochB) + 2 <= epoch) {
            _fold(msg.sender, b.amountB, b.unitsB);
            b.amountB = 0;
            b.unitsB = 0;
            changed = true;
        }
        if (changed) pendingOf[msg.sender] = b;
        _withdraw(msg.sender);
    }

    /// Proves leaf `leafIndex` of the round in ring slot `idx` carries a bad signature: recomputes the
    /// round's hash from the full leaf list (calldata of its post), runs ecrecover, and on a bad signature
    /// voids the round's payouts (taking them back from the providers' pending buckets) and slashes the bond.
    function challengeSignature(
        uint256 idx,
        uint256 leafIndex,
        uint256 deadline,
        address[] calldata providers,
        Leaf[] calldata leaves,
        bytes32[] calldata sigs
    ) external {
        Rec memory rec = ringRec[idx];
        if (rec.status != POSTED && rec.status != REVEALED) revert BadRound();
        if (block.timestamp > uint256(rec.postedAt) + window) revert WindowClosed();
        uint256 orderId = rec.orderId;
        bytes32 h = _start(orderId, rec.round, providers);
        for (uint256 i; i < leaves.length; ++i) {
            h = _h3(h, leaves[i].p, leaves[i].commitment);
        }
        uint256 off_sigs;
        assembly ("memory-safe") { off_sigs := sigs.offset }
        bytes32 aux = _h2(_hashCalldata(off_sigs, sigs.length * 32), deadline);
        if (_h2(h, uint256(aux)) != ringHash[idx]) revert HashMismatch();
        Order memory o = _orders[orderId];
        OrderState memory s = _states[orderId];
        uint256 k = o.replicas;
        Leaf calldata leaf = leaves[leafIndex];
        address provider = providers[leaf.p];
        bytes32 d = _workDigest(
            _domainSeparatorV4(), orderId, rec.round, leafIndex / k, provider, leaf.commitment, s.price, deadline
        );
        if (_recover(d, sigs[2 * leafIndex], sigs[2 * leafIndex + 1]) == provider) revert SignatureValid();
        if (rec.status == REVEALED) {
            uint256 reversed;
            for (uint256 i; i < leaves.length; ++i) {
                if (rec.paidMask & (1 << (i / k)) == 0) continue;
                _debit(providers[leaves[i].p], s.price, rec.revealEpoch);
                reversed += s.price;
            }
            Totals memory t = totals;
            if (o.closed) {
                _accounts[o.buyer].credit += uint128(reversed); // stays a credit, now the buyer's
            } else {
                s.balance += uint96(reversed);
                _states[orderId] = s;
                t.escrow += uint96(reversed);
                t.credits -= uint96(reversed);
            }
            totals = t;
        }
        rec.status = VOIDED;
        ringRec[idx] = rec;
        uint256 slashed = operatorBond < slashAmount ? operatorBond : slashAmount;
        operatorBond -= slashed;
        uint256 reward = slashed / 2;
        _accounts[msg.sender].credit += uint128(reward);
        totals.credits += uint96(reward);
        compensationPool += slashed - reward; // for the voided round's honest providers (not implemented)
    }

    function _post(
        uint256 orderId,
        uint256 round,
        Order memory o,
        OrderState memory s,
        uint256 deadline,
        address[] calldata providers,
        Leaf[] calldata leaves,
        bytes32[] calldata sigs
    ) internal {
        if (block.timestamp > deadline) revert Expired();
        uint256 k = o.replicas;
        uint256 n = providers.length;
        if (
            leaves.length != (uint256(o.shards) + 1) * k || sigs.length != 2 * leaves.length || n == 0
                || providers[0] == address(0)
        ) revert BadEntries();
        bytes32 h = _start(orderId, round, providers);
        uint256[] memory uses = new uint256[](n);
        for (uint256 i; i < leaves.length; ++i) {
            uint256 p = leaves[i].p;
            if (p >= n) revert BadEntries();
            uint256 rep = i % k;
            for (uint256 j = 1; j <= rep; ++j) {
                if (leaves[i - j].p == p) revert BadEntries();
            }
            ++uses[p];
            h = _h3(h, p, leaves[i].commitment);
        }
        _checkStakes(providers, uses);
        uint256 off_sigs;
        assembly ("memory-safe") { off_sigs := sigs.offset }
        bytes32 aux = _h2(_hashCalldata(off_sigs, sigs.length * 32), deadline);
        Totals memory t = totals;
        uint256 idx = t.roundCount % ring;
        t.roundCount += 1;
        totals = t;
        Rec memory old = ringRec[idx];
        if (old.status != 0 && block.timestamp <= uint256(old.postedAt) + window) revert RingBusy();
        ringHash[idx] = _h2(h, uint256(aux));
        ringRec[idx] = Rec(uint64(orderId), uint16(round), uint40(block.timestamp), uint48(block.number), POSTED, 0, 0);
        s.pending = uint48(idx + 1);
        s.committed += 1;
    }

    function _reveal(
        uint256 orderId,
        uint256 round,
        Order memory o,
        OrderState memory s,
        address[] calldata providers,
        Opening[] calldata ops,
        bytes32 aux
    ) internal {
        if (s.pending == 0) revert BadRound();
        uint256 idx = s.pending - 1;
        Rec memory rec = ringRec[idx];
        if (rec.orderId != orderId || rec.round != round) revert BadRound();
        if (block.number <= rec.seedBlock) revert TooEarly();
        uint256 units = uint256(o.shards) + 1;
        (bytes32 h, uint256[] memory paid, uint256 paidUnits, uint256 mask) =
            _checkOpenings(orderId, round, o.replicas, units, blockhash(rec.seedBlock), providers, ops);
        if (_h2(h, uint256(aux)) != ringHash[idx]) revert HashMismatch();
        s.pending = 0;
        if (rec.status == VOIDED) return; // voided before its reveal: nothing paid, escrow stays
        uint256 epoch = block.timestamp / window;
        uint256 price = s.price;
        for (uint256 i; i < providers.length; ++i) {
            uint256 count = paid[i];
            if (count != 0) _credit(providers[i], count * price, count, epoch);
        }
        uint96 total = uint96(paidUnits * o.replicas * price);
        s.balance -= total;
        Totals memory t = totals;
        t.escrow -= total;
        t.credits += total;
        totals = t;
        rec.status = REVEALED;
        rec.paidMask = uint32(((1 << units) - 1) & ~mask);
        rec.revealEpoch = uint32(epoch);
        ringRec[idx] = rec;
        if (mask != 0) {
            uint256 off_ops;
            assembly ("memory-safe") { off_ops := ops.offset }
            setAside[orderId << 16 | round] = _h2(_hashCalldata(off_ops, ops.length * 96), mask);
            _orders[orderId].held = o.held + 1;
            emit RoundSetAside(orderId, round, mask);
        }
    }

    function _credit(address provider, uint256 amount, uint256 count, uint256 epoch) internal {
        Pending memory b = pendingOf[provider];
        if (epoch & 1 == 0) {
            if (b.epochA != uint24(epoch)) {
                if (b.amountA != 0) _fold(provider, b.amountA, b.unitsA);
                b.amountA = 0;
                b.unitsA = 0;
                b.epochA = uint24(epoch);
            }
            b.amountA += uint88(amount);
            b.unitsA += uint16(count);
        } else {
            if (b.epochB != uint24(epoch)) {
                if (b.amountB != 0) _fold(provider, b.amountB, b.unitsB);
                b.amountB = 0;
                b.unitsB = 0;
                b.epochB = uint24(epoch);
            }
            b.amountB += uint88(amount);
            b.unitsB += uint16(count);
        }
        pendingOf[provider] = b;
    }

    function _debit(address provider, uint256 amount, uint256 epoch) internal {
        Pending memory b = pendingOf[provider];
        if (epoch & 1 == 0) {
            b.amountA -= uint88(amount);
            b.unitsA -= 1;
        } else {
            b.amountB -= uint88(amount);
            b.unitsB -= 1;
        }
        pendingOf[provider] = b;
    }

    function _fold(address provider, uint256 amount, uint256 count) internal {
        Account memory a = _accounts[provider];
        a.credit += uint128(amount);
        a.valid += uint32(count);
        a.consecutiveValid += uint32(count);
        _accounts[provider] = a;
    }
}
