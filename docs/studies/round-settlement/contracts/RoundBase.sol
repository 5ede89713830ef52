// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {RoundStake} from "./RoundStake.sol";

/// THROWAWAY PROTOTYPE (gas study, not production). Orders of `rounds` rounds, each of `shards` shard units
/// plus one aggregate unit (unit index `shards`), `replicas` providers per unit. Escrow is
/// rounds x (shards + 1) x replicas x price. A round's replicas are listed unit by unit (entry i is replica
/// i % k of unit i / k), each naming its provider by index into a per-round, strictly increasing
/// provider list, so each distinct provider is looked up once per round.
abstract contract RoundBase is EIP712 {
    using SafeERC20 for IERC20;

    bytes32 internal constant ROUND_WORK_TYPEHASH = keccak256(
        "RoundWork(uint256 orderId,uint256 round,uint256 unit,address provider,bytes32 commitment,uint256 price,uint256 deadline)"
    );
    uint256 internal constant PPM = 1_000_000;
    uint256 internal constant HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;
    uint256 internal constant S_MASK = (1 << 255) - 1;

    /// slot 0
    struct Order {
        address buyer;
        uint40 deadline;
        uint16 rounds;
        uint8 shards;
        uint8 replicas;
        bool closed;
        uint16 held; // rounds with units set aside for verification
    }

    /// slot 1: what every round touches
    struct OrderState {
        uint96 price;
        uint96 balance;
        uint16 committed; // rounds committed so far
        uint48 pending; // A: seed block of the committed, unrevealed round (0: none); B: 1 + its ring index
    }

    struct Account {
        uint128 credit;
        uint32 valid;
        uint32 fault;
        uint32 fraud;
        uint32 consecutiveValid;
    }

    struct Totals {
        uint96 escrow;
        uint96 credits;
        uint64 roundCount;
    }

    struct Opening {
        uint256 p;
        bytes32 digest;
        bytes32 salt;
    }

    IERC20 public immutable token;
    RoundStake public immutable stakes;
    address public immutable operator;
    uint256 public immutable collateral;
    uint32 public immutable spotPpm;
    uint32 public immutable soloPpm;
    bool public immutable checkStake;

    uint256 public orderCount;
    Totals public totals;
    mapping(uint256 => Order) internal _orders;
    mapping(uint256 => OrderState) internal _states;
    mapping(address => Account) internal _accounts;
    /// orderId << 16 | round => keccak(setAsideMask, openings): units left for the verifier path
    mapping(uint256 => bytes32) public setAside;

    error NotOperator();
    error BadOrder();
    error BadRound();
    error BadEntries();
    error BadSignature(uint256 index);
    error StakeTooLow(address provider);
    error HashMismatch();
    error TooEarly();
    error Expired();

    event OrderPosted(uint256 indexed orderId, address indexed buyer, bytes32 specHash, uint256 escrow);
    event RoundSetAside(uint256 indexed orderId, uint256 round, uint256 mask);

    constructor(
        string memory name,
        IERC20 token_,
        RoundStake stakes_,
        address operator_,
        uint256 collateral_,
        uint32 spotPpm_,
        uint32 soloPpm_,
        bool checkStake_
    ) EIP712(name, "1") {
        token = token_;
        stakes = stakes_;
        operator = operator_;
        collateral = collateral_;
        spotPpm = spotPpm_;
        soloPpm = soloPpm_;
        checkStake = checkStake_;
    }

    // ------------------------------------------------------------------ buyer

    /// `fee` per unit is escrowed for the verifier path; a unit paid on the fast path leaves it in the balance
    /// (refunded at close), as the repo's verifier fee.
    function postOrder(
        bytes32 specHash,
        uint16 rounds,
        uint8 shards,
        uint8 replicas,
        uint256 price,
        uint256 fee,
        uint40 deadline
    )
        external
        returns (uint256 orderId)
    {
        if (rounds == 0 || replicas == 0 || replicas > 5 || shards == 0 || shards > 31) revert BadOrder();
        if (deadline <= block.timestamp) revert BadOrder();
        uint256 escrow = uint256(rounds) * (uint256(shards) + 1) * (replicas * price + fee);
        uint96 escrow96 = SafeCast.toUint96(escrow);
        orderId = ++orderCount;
        _orders[orderId] = Order(msg.sender, deadline, rounds, shards, replicas, false, 0);
        _states[orderId] = OrderState(uint96(price), escrow96, 0, 0);
        totals.escrow += escrow96;
        emit OrderPosted(orderId, msg.sender, specHash, escrow);
        uint256 before = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), escrow);
        if (token.balanceOf(address(this)) - before != escrow) revert BadOrder();
    }

    /// Buyer at any time, anyone after the deadline; no round may be pending or set aside.
    function closeOrder(uint256 orderId) external {
        Order storage o = _orders[orderId];
        address buyer = o.buyer;
        if (buyer == address(0) || o.closed || o.held != 0) revert BadOrder();
        if (msg.sender != buyer && block.timestamp <= o.deadline) revert BadOrder();
        OrderState storage s = _states[orderId];
        if (s.pending != 0) revert BadRound();
        uint96 refund = s.balance;
        s.balance = 0;
        o.closed = true;
        _accounts[buyer].credit += refund;
        Totals memory t = totals;
        t.escrow -= refund;
        t.credits += refund;
        totals = t;
    }

    function withdraw() external virtual {
        _withdraw(msg.sender);
    }

    function _withdraw(address account) internal {
        Account storage a = _accounts[account];
        uint128 amount = a.credit;
        if (amount == 0) revert BadOrder();
        a.credit = 0;
        totals.credits -= uint96(amount);
        token.safeTransfer(account, amount);
    }

    // ------------------------------------------------------------------ views

    function accountOf(address account) external view returns (Account memory) {
        return _accounts[account];
    }

    function orderOf(uint256 orderId) external view returns (Order memory, OrderState memory) {
        return (_orders[orderId], _states[orderId]);
    }

    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internals

    modifier onlyOperator() {
        if (msg.sender != operator) revert NotOperator();
        _;
    }

    /// Checks the order accepts round `round` now; returns its header and state.
    function _openRound(uint256 orderId, uint256 round)
        internal
        view
        returns (Order memory o, OrderState memory s)
    {
        o = _orders[orderId];
        if (o.buyer == address(0) || o.closed) revert BadOrder();
        if (block.timestamp > o.deadline) revert Expired();
        s = _states[orderId];
        if (round != s.committed || round >= o.rounds) revert BadRound();
    }

    /// keccak256(abi.encode(orderId, round, keccak256(providers))) ; providers must be strictly increasing.
    function _start(uint256 orderId, uint256 round, address[] calldata providers) internal pure returns (bytes32 h) {
        for (uint256 i = 1; i < providers.length; ++i) {
            if (providers[i] <= providers[i - 1]) revert BadEntries();
        }
        assembly ("memory-safe") {
            let m := mload(0x40)
            let len := mul(providers.length, 0x20)
            calldatacopy(m, providers.offset, len)
            let ph := keccak256(m, len)
            mstore(m, orderId)
            mstore(add(m, 0x20), round)
            mstore(add(m, 0x40), ph)
            h := keccak256(m, 0x60)
        }
    }

    function _h3(bytes32 a, uint256 b, bytes32 c) internal pure returns (bytes32 r) {
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, a)
            mstore(add(m, 0x20), b)
            mstore(add(m, 0x40), c)
            r := keccak256(m, 0x60)
        }
    }

    function _h2(bytes32 a, uint256 b) internal pure returns (bytes32 r) {
        assembly ("memory-safe") {
            mstore(0x00, a)
            mstore(0x20, b)
            r := keccak256(0x00, 0x40)
        }
    }

    /// keccak256(abi.encode(resultDigest, salt, provider, unitKey))
    function _commitmentOf(bytes32 digest, bytes32 salt, address provider, uint256 unitKey)
        internal
        pure
        returns (bytes32 r)
    {
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, digest)
            mstore(add(m, 0x20), salt)
            mstore(add(m, 0x40), provider)
            mstore(add(m, 0x60), unitKey)
            r := keccak256(m, 0x80)
        }
    }

    function _unitKey(uint256 orderId, uint256 round, uint256 unit) internal pure returns (uint256) {
        return orderId << 64 | round << 16 | unit;
    }

    /// The EIP-712 digest of RoundWork(orderId, round, unit, provider, commitment, price, deadline).
    function _workDigest(
        bytes32 domain,
        uint256 orderId,
        uint256 round,
        uint256 unit,
        address provider,
        bytes32 commitment,
        uint256 price,
        uint256 deadline
    ) internal pure returns (bytes32 d) {
        bytes32 typehash = ROUND_WORK_TYPEHASH;
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, typehash)
            mstore(add(m, 0x20), orderId)
            mstore(add(m, 0x40), round)
            mstore(add(m, 0x60), unit)
            mstore(add(m, 0x80), provider)
            mstore(add(m, 0xa0), commitment)
            mstore(add(m, 0xc0), price)
            mstore(add(m, 0xe0), deadline)
            let sh := keccak256(m, 0x100)
            mstore(m, hex"1901")
            mstore(add(m, 0x02), domain)
            mstore(add(m, 0x22), sh)
            d := keccak256(m, 0x42)
        }
    }

    /// ecrecover of an EIP-2098 compact signature (r, vs); zero for a malformed one.
    function _recover(bytes32 digest, bytes32 r, bytes32 vs) internal pure returns (address) {
        uint256 s = uint256(vs) & S_MASK;
        if (s > HALF_N) return address(0);
        uint8 v = uint8((uint256(vs) >> 255) + 27);
        return ecrecover(digest, v, r, bytes32(s));
    }

    /// One bondedOf call per distinct provider: bonded stake must cover its replicas this round.
    function _checkStakes(address[] calldata providers, uint256[] memory uses) internal view {
        if (!checkStake) return;
        for (uint256 i; i < providers.length; ++i) {
            if (stakes.bondedOf(providers[i]) < collateral * uses[i]) revert StakeTooLow(providers[i]);
        }
    }

    /// The spot-check draw of one unit from the seed block's hash (zero hash: drawn).
    function _drawn(bytes32 seed, uint256 unitKey, uint256 rate) internal pure returns (bool) {
        return seed == 0 || uint256(_h2(seed, unitKey)) % PPM < rate;
    }

    /// Checks a round's openings against its chained commitment hash and decides its units: returns the
    /// chain hash, per provider the count of paid (undrawn, unanimous) replicas, the paid unit count and the
    /// mask of units set aside (drawn or not unanimous).
    function _checkOpenings(
        uint256 orderId,
        uint256 round,
        uint256 k,
        uint256 units,
        bytes32 seed,
        address[] calldata providers,
        Opening[] calldata ops
    ) internal view returns (bytes32 h, uint256[] memory paid, uint256 paidUnits, uint256 mask) {
        if (ops.length != units * k) revert BadEntries();
        uint256 rate = k == 1 ? soloPpm : spotPpm;
        h = _start(orderId, round, providers);
        paid = new uint256[](providers.length);
        uint256 n = providers.length;
        for (uint256 unit; unit < units; ++unit) {
            uint256 unitKey = _unitKey(orderId, round, unit);
            bool unanimous = true;
            bytes32 d0;
            uint256 base = unit * k;
            for (uint256 r; r < k; ++r) {
                Opening calldata op = ops[base + r];
                uint256 p = op.p;
                if (p >= n) revert BadEntries();
                h = _h3(h, p, _commitmentOf(op.digest, op.salt, providers[p], unitKey));
                if (r == 0) d0 = op.digest;
                else if (op.digest != d0) unanimous = false;
            }
            if (!unanimous || _drawn(seed, unitKey, rate)) {
                mask |= 1 << unit;
            } else {
                ++paidUnits;
                for (uint256 r; r < k; ++r) {
                    ++paid[ops[base + r].p];
                }
            }
        }
    }

    function _hashCalldata(uint256 offset, uint256 len) internal pure returns (bytes32 r) {
        assembly ("memory-safe") {
            let m := mload(0x40)
            calldatacopy(m, offset, len)
            r := keccak256(m, len)
        }
    }
}
