// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {RoundBase} from "./RoundBase.sol";
import {RoundStake} from "./RoundStake.sol";

/// THROWAWAY PROTOTYPE. Design A with a fixed roster ("A-roster"): the order's (unit, replica) -> provider
/// layout is fixed at round 0 (DiLoCo workers keep their shard), stored as one hash; each provider's bond is
/// checked once per order (the order must end within the stake's unbonding period). Every round still
/// verifies every replica's RoundWork signature on chain (pipelined: reveal r-1 + commit r in one tx), but
/// a round whose units are all undrawn and unanimous writes nothing per provider: the order's committed
/// round count is the payout record, and {closeRoster} credits each roster provider once per order
/// (credit and reputation: count x rounds). A round with any drawn or non-unanimous unit is set aside whole.
contract RoundMarketAR is RoundBase {
    struct Sig {
        bytes32 commitment;
        bytes32 r;
        bytes32 vs;
    }

    struct Op {
        bytes32 digest;
        bytes32 salt;
    }

    mapping(uint256 => bytes32) public roundHash;
    mapping(uint256 => bytes32) public rosterOf;

    constructor(
        IERC20 token_,
        RoundStake stakes_,
        address operator_,
        uint256 collateral_,
        uint32 spotPpm_,
        uint32 soloPpm_,
        bool checkStake_
    ) RoundBase("Veritrain RoundMarketAR", token_, stakes_, operator_, collateral_, spotPpm_, soloPpm_, checkStake_) {}

    /// Reveals round `round - 1` (if any) and commits round `round`. `layout` holds replica i's provider
    /// index in bits [5i, 5i + 5).
    function stepRound(
        uint256 orderId,
        uint256 round,
        Op[] calldata prevOps,
        uint256 deadline,
        address[] calldata providers,
        uint256 layout,
        Sig[] calldata sigs
    ) external onlyOperator {
        (Order memory o, OrderState memory s) = _openRound(orderId, round);
        if (block.timestamp > deadline) revert Expired();
        uint256 k = o.replicas;
        uint256 total = (uint256(o.shards) + 1) * k;
        if (sigs.length != total) revert BadEntries();
        bytes32 roster = _rosterHash(providers, layout);
        if (round == 0) {
            if (s.pending != 0) revert BadRound();
            _setRoster(orderId, o, providers, layout, total);
            rosterOf[orderId] = roster;
        } else {
            if (s.pending == 0 || rosterOf[orderId] != roster) revert BadRound();
            _reveal(orderId, round - 1, o, s, providers, layout, prevOps);
        }
        bytes32 domain = _domainSeparatorV4();
        bytes32 h = _h2(bytes32(orderId), round);
        uint256 price = s.price;
        for (uint256 i; i < total; ++i) {
            Sig calldata e = sigs[i];
            address provider = providers[(layout >> (5 * i)) & 31];
            bytes32 d = _workDigest(domain, orderId, round, i / k, provider, e.commitment, price, deadline);
            if (_recover(d, e.r, e.vs) != provider) revert BadSignature(i);
            h = _h2(h, uint256(e.commitment));
        }
        roundHash[orderId] = h;
        s.pending = uint48(block.number);
        s.committed += 1;
        _states[orderId] = s;
    }

    function revealLast(uint256 orderId, uint256 round, address[] calldata providers, uint256 layout, Op[] calldata ops)
        external
    {
        Order memory o = _orders[orderId];
        OrderState memory s = _states[orderId];
        if (s.pending == 0 || round + 1 != s.committed) revert BadRound();
        if (rosterOf[orderId] != _rosterHash(providers, layout)) revert BadRound();
        _reveal(orderId, round, o, s, providers, layout, ops);
        _states[orderId] = s;
    }

    /// Closes the order: credits each roster provider for every fully paid round (one SSTORE each), the
    /// buyer the rest.
    function closeRoster(uint256 orderId, address[] calldata providers, uint256 layout) external {
        Order storage ord = _orders[orderId];
        Order memory o = ord;
        if (o.buyer == address(0) || o.closed || o.held != 0) revert BadOrder();
        if (msg.sender != o.buyer && block.timestamp <= o.deadline) revert BadOrder();
        if (rosterOf[orderId] != _rosterHash(providers, layout)) revert BadRound();
        OrderState memory s = _states[orderId];
        if (s.pending != 0) revert BadRound();
        uint256 rounds = s.committed; // every revealed round not set aside (held == 0)
        uint256 total = (uint256(o.shards) + 1) * o.replicas;
        uint256[] memory per = new uint256[](providers.length);
        for (uint256 i; i < total; ++i) {
            ++per[(layout >> (5 * i)) & 31];
        }
        uint256 paid;
        if (rounds != 0) {
            for (uint256 p; p < providers.length; ++p) {
                uint256 count = per[p] * rounds;
                if (count == 0) continue;
                Account memory a = _accounts[providers[p]];
                a.credit += uint128(count * s.price);
                a.valid += uint32(count);
                a.consecutiveValid += uint32(count);
                _accounts[providers[p]] = a;
                paid += count * s.price;
            }
        }
        uint96 refund = s.balance - uint96(paid);
        s.balance = 0;
        _states[orderId] = s;
        ord.closed = true;
        _accounts[o.buyer].credit += refund;
        Totals memory t = totals;
        t.escrow -= uint96(paid) + refund;
        t.credits += uint96(paid) + refund;
        totals = t;
    }

    function _rosterHash(address[] calldata providers, uint256 layout) internal pure returns (bytes32) {
        return _h2(_start(0, 0, providers), layout);
    }

    function _setRoster(
        uint256 orderId,
        Order memory o,
        address[] calldata providers,
        uint256 layout,
        uint256 total
    ) internal view {
        uint256 n = providers.length;
        if (n == 0 || n > 32 || providers[0] == address(0) || layout >> (5 * total) != 0) revert BadEntries();
        if (o.deadline > block.timestamp + stakes.unbondingPeriod()) revert BadOrder();
        uint256 k = o.replicas;
        uint256[] memory uses = new uint256[](n);
        for (uint256 i; i < total; ++i) {
            uint256 p = (layout >> (5 * i)) & 31;
            if (p >= n) revert BadEntries();
            for (uint256 j = 1; j <= i % k; ++j) {
                if ((layout >> (5 * (i - j))) & 31 == p) revert BadEntries();
            }
            ++uses[p];
        }
        _checkStakes(providers, uses); // per-order exposure: one round's replicas x collateral
        orderId;
    }

    function _reveal(
        uint256 orderId,
        uint256 round,
        Order memory o,
        OrderState memory s,
        address[] calldata providers,
        uint256 layout,
        Op[] calldata ops
    ) internal {
        uint256 seedBlock = s.pending;
        if (block.number <= seedBlock) revert TooEarly();
        bytes32 seed = blockhash(seedBlock);
        uint256 k = o.replicas;
        uint256 units = uint256(o.shards) + 1;
        if (ops.length != units * k) revert BadEntries();
        uint256 rate = k == 1 ? soloPpm : spotPpm;
        bytes32 h = _h2(bytes32(orderId), round);
        uint256 mask;
        for (uint256 unit; unit < units; ++unit) {
            uint256 unitKey = _unitKey(orderId, round, unit);
            bool unanimous;
            (h, unanimous) = _openUnit(h, ops, unit * k, k, providers, layout, unitKey);
            if (!unanimous || _drawn(seed, unitKey, rate)) mask |= 1 << unit;
        }
        if (h != roundHash[orderId]) revert HashMismatch();
        s.pending = 0;
        if (mask != 0) {
            uint256 off;
            assembly ("memory-safe") {
                off := ops.offset
            }
            setAside[orderId << 16 | round] = _h2(_hashCalldata(off, ops.length * 64), mask);
            _orders[orderId].held = o.held + 1;
            emit RoundSetAside(orderId, round, mask);
        }
    }

    function _openUnit(
        bytes32 h,
        Op[] calldata ops,
        uint256 base,
        uint256 k,
        address[] calldata providers,
        uint256 layout,
        uint256 unitKey
    ) internal pure returns (bytes32, bool unanimous) {
        unanimous = true;
        bytes32 d0 = ops[base].digest;
        for (uint256 r; r < k; ++r) {
            uint256 i = base + r;
            Op calldata op = ops[i];
            address provider = providers[(layout >> (5 * i)) & 31];
            h = _h2(h, uint256(_commitmentOf(op.digest, op.salt, provider, unitKey)));
            if (op.digest != d0) unanimous = false;
        }
        return (h, unanimous);
    }
}
