// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {RoundBase} from "./RoundBase.sol";
import {RoundStake} from "./RoundStake.sol";

/// THROWAWAY PROTOTYPE. Design A, "verified round": per round one commit transaction that checks every
/// replica's RoundWork signature (its accept and commit in one) with ecrecover and each distinct provider's
/// bonded stake once, storing one chained hash of the round's (provider index, commitment) list plus the
/// commit block (whose successor's hash draws the spot checks); then one reveal transaction that checks
/// every opening against that hash, draws each unit, sets drawn or non-unanimous units aside (one slot,
/// only when any) and pays the rest: one SSTORE per distinct provider (credit and reputation share a
/// slot), the order's state once, the totals once. `stepRound` reveals round r-1 and commits round r in
/// one transaction (the single-transaction pipeline).
contract RoundMarketA is RoundBase {
    /// A replica's signed entry: provider index, commitment, EIP-2098 compact signature.
    struct Entry {
        uint256 p;
        bytes32 commitment;
        bytes32 r;
        bytes32 vs;
    }

    /// Opening with the commitment sent again (the brief's variant).
    struct OpeningC {
        uint256 p;
        bytes32 commitment;
        bytes32 digest;
        bytes32 salt;
    }

    /// The committed, unrevealed round's chained commitment hash, per order.
    mapping(uint256 => bytes32) public roundHash;

    constructor(
        IERC20 token_,
        RoundStake stakes_,
        address operator_,
        uint256 collateral_,
        uint32 spotPpm_,
        uint32 soloPpm_,
        bool checkStake_
    ) RoundBase("Veritrain RoundMarketA", token_, stakes_, operator_, collateral_, spotPpm_, soloPpm_, checkStake_) {}

    function commitRound(
        uint256 orderId,
        uint256 round,
        uint256 deadline,
        address[] calldata providers,
        Entry[] calldata entries
    ) external onlyOperator {
        (Order memory o, OrderState memory s) = _openRound(orderId, round);
        if (s.pending != 0) revert BadRound();
        _commit(orderId, round, deadline, o, s, providers, entries);
        _states[orderId] = s;
    }

    /// Openings only: each commitment is recomputed from its opening and the chain hash compared.
    function revealRound(uint256 orderId, uint256 round, address[] calldata providers, Opening[] calldata ops)
        external
    {
        Order memory o = _orders[orderId];
        OrderState memory s = _states[orderId];
        if (s.pending == 0 || round + 1 != s.committed) revert BadRound();
        _reveal(orderId, round, o, s, providers, ops);
        _states[orderId] = s;
    }

    /// The brief's variant: the (provider, commitment) entries are sent again beside the openings.
    function revealRoundWithCommitments(
        uint256 orderId,
        uint256 round,
        address[] calldata providers,
        OpeningC[] calldata ops
    ) external {
        Order memory o = _orders[orderId];
        OrderState memory s = _states[orderId];
        if (s.pending == 0 || round + 1 != s.committed) revert BadRound();
        uint256 seedBlock = s.pending;
        if (block.number <= seedBlock) revert TooEarly();
        uint256 k = o.replicas;
        uint256 units = uint256(o.shards) + 1;
        if (ops.length != units * k) revert BadEntries();
        bytes32 seed = blockhash(seedBlock);
        uint256 rate = k == 1 ? soloPpm : spotPpm;
        bytes32 h = _start(orderId, round, providers);
        uint256[] memory paid = new uint256[](providers.length);
        uint256 paidUnits;
        uint256 mask;
        for (uint256 unit; unit < units; ++unit) {
            uint256 unitKey = _unitKey(orderId, round, unit);
            bool unanimous = true;
            bytes32 d0;
            for (uint256 r; r < k; ++r) {
                OpeningC calldata op = ops[unit * k + r];
                uint256 p = op.p;
                if (p >= providers.length) revert BadEntries();
                if (_commitmentOf(op.digest, op.salt, providers[p], unitKey) != op.commitment) revert HashMismatch();
                h = _h3(h, p, op.commitment);
                if (r == 0) d0 = op.digest;
                else if (op.digest != d0) unanimous = false;
            }
            if (!unanimous || _drawn(seed, unitKey, rate)) {
                mask |= 1 << unit;
            } else {
                ++paidUnits;
                for (uint256 r; r < k; ++r) {
                    ++paid[ops[unit * k + r].p];
                }
            }
        }
        if (h != roundHash[orderId]) revert HashMismatch();
        uint256 off_ops;
        assembly ("memory-safe") { off_ops := ops.offset }
        _settle(orderId, round, o, s, providers, paid, paidUnits, mask, off_ops, ops.length * 128);
        _states[orderId] = s;
    }

    /// Reveals round `round - 1` (if any) and commits round `round`, in one transaction.
    function stepRound(
        uint256 orderId,
        uint256 round,
        address[] calldata prevProviders,
        Opening[] calldata prevOps,
        uint256 deadline,
        address[] calldata providers,
        Entry[] calldata entries
    ) external onlyOperator {
        (Order memory o, OrderState memory s) = _openRound(orderId, round);
        if (round > 0) {
            if (s.pending == 0) revert BadRound();
            _reveal(orderId, round - 1, o, s, prevProviders, prevOps);
        } else if (s.pending != 0) {
            revert BadRound();
        }
        _commit(orderId, round, deadline, o, s, providers, entries);
        _states[orderId] = s;
    }

    function _commit(
        uint256 orderId,
        uint256 round,
        uint256 deadline,
        Order memory o,
        OrderState memory s,
        address[] calldata providers,
        Entry[] calldata entries
    ) internal {
        if (block.timestamp > deadline) revert Expired();
        uint256 k = o.replicas;
        uint256 n = providers.length;
        if (entries.length != (uint256(o.shards) + 1) * k || n == 0 || providers[0] == address(0)) {
            revert BadEntries();
        }
        bytes32 h = _start(orderId, round, providers);
        uint256[] memory uses = new uint256[](n);
        bytes32 domain = _domainSeparatorV4();
        uint256 price = s.price;
        for (uint256 i; i < entries.length; ++i) {
            Entry calldata e = entries[i];
            uint256 p = e.p;
            if (p >= n) revert BadEntries();
            uint256 unit = i / k;
            uint256 rep = i - unit * k;
            for (uint256 j = 1; j <= rep; ++j) {
                if (entries[i - j].p == p) revert BadEntries();
            }
            address provider = providers[p];
            ++uses[p];
            bytes32 d = _workDigest(domain, orderId, round, unit, provider, e.commitment, price, deadline);
            if (_recover(d, e.r, e.vs) != provider) revert BadSignature(i);
            h = _h3(h, p, e.commitment);
        }
        _checkStakes(providers, uses);
        roundHash[orderId] = h;
        s.pending = uint48(block.number);
        s.committed += 1;
    }

    function _reveal(
        uint256 orderId,
        uint256 round,
        Order memory o,
        OrderState memory s,
        address[] calldata providers,
        Opening[] calldata ops
    ) internal {
        uint256 seedBlock = s.pending;
        if (block.number <= seedBlock) revert TooEarly();
        (bytes32 h, uint256[] memory paid, uint256 paidUnits, uint256 mask) = _checkOpenings(
            orderId, round, o.replicas, uint256(o.shards) + 1, blockhash(seedBlock), providers, ops
        );
        if (h != roundHash[orderId]) revert HashMismatch();
        uint256 off_ops;
        assembly ("memory-safe") { off_ops := ops.offset }
        _settle(orderId, round, o, s, providers, paid, paidUnits, mask, off_ops, ops.length * 96);
    }

    /// Pays the round's undrawn unanimous units; `s` is written by the caller.
    function _settle(
        uint256 orderId,
        uint256 round,
        Order memory o,
        OrderState memory s,
        address[] calldata providers,
        uint256[] memory paid,
        uint256 paidUnits,
        uint256 mask,
        uint256 opsOffset,
        uint256 opsLength
    ) internal {
        uint256 price = s.price;
        for (uint256 i; i < providers.length; ++i) {
            uint256 count = paid[i];
            if (count == 0) continue;
            address provider = providers[i];
            Account memory a = _accounts[provider];
            a.credit += uint128(count * price);
            a.valid += uint32(count);
            a.consecutiveValid += uint32(count);
            _accounts[provider] = a;
        }
        uint96 total = uint96(paidUnits * o.replicas * price);
        s.balance -= total;
        s.pending = 0;
        Totals memory t = totals;
        t.escrow -= total;
        t.credits += total;
        totals = t;
        if (mask != 0) {
            setAside[orderId << 16 | round] = _h2(_hashCalldata(opsOffset, opsLength), mask);
            _orders[orderId].held = o.held + 1;
            emit RoundSetAside(orderId, round, mask);
        }
    }
}
