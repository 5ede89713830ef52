// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {TypedSignatures} from "./TypedSignatures.sol";

/// @title StakeManager
/// @notice Holds the stake of providers and verifiers. Stake is bonded, part of it may be locked as
/// collateral for active units (by the market), and unstaking goes through an unbonding period during
/// which the stake stays slashable. Slashed tokens leave to the market at once, so they can never be
/// withdrawn by the slashed account.
/// @dev Every staker action has a signed form (EIP-712 domain "Veritrain StakeManager", "1") that anyone
/// may relay, so a provider needs no gas:
/// - `RequestUnstake(address staker,uint256 amount,uint256 nonce,uint256 deadline)`
/// - `Withdraw(address staker,uint256 nonce,uint256 deadline)`
/// Staking by signature uses the token's own ERC-2612 permit ({stakeWithPermit}).
/// Invariants: locked <= bonded per account; totalStaked == sum of bonded + unbonding;
/// token balance >= totalStaked (equal unless someone donates tokens).
contract StakeManager is AccessControl, ReentrancyGuardTransient, TypedSignatures {
    using SafeERC20 for IERC20;

    /// @notice Role of the market contracts that may lock, unlock and slash stake.
    bytes32 public constant MARKET_ROLE = keccak256("MARKET_ROLE");

    bytes32 private constant REQUEST_UNSTAKE_TYPEHASH =
        keccak256("RequestUnstake(address staker,uint256 amount,uint256 nonce,uint256 deadline)");
    bytes32 private constant WITHDRAW_TYPEHASH = keccak256("Withdraw(address staker,uint256 nonce,uint256 deadline)");

    /// @dev Two slots per account: what `lock` touches sits alone in the first.
    struct StakeAccount {
        uint128 bonded;
        uint128 locked;
        uint128 unbonding;
        uint64 thawAt;
    }

    /// @notice The stake token.
    IERC20 public immutable token;
    /// @notice Seconds between an unstake request and the moment its tokens can be withdrawn.
    uint64 public immutable unbondingPeriod;

    mapping(address account => StakeAccount) private _accounts;
    uint256 private _totalStaked;
    mapping(address account => uint256) private _nonces;

    /// @notice `amount` is zero where a positive amount is required.
    error ZeroAmount();
    /// @notice `requested` exceeds the account's free (bonded minus locked) stake.
    error InsufficientFreeStake(address account, uint256 free, uint256 requested);
    /// @notice The account has no unbonding stake.
    error NothingToWithdraw(address account);
    /// @notice The unbonding stake thaws at `thawAt`.
    error StakeStillThawing(address account, uint64 thawAt);
    /// @notice The token moved a different amount than requested (fee-on-transfer tokens are unsupported).
    error TransferAmountMismatch(uint256 expected, uint256 received);
    /// @notice A constructor argument is unusable.
    error InvalidParameter(string name);

    /// @notice `account` bonded `amount` more stake.
    event Staked(address indexed account, uint256 amount);
    /// @notice `amount` of `account`'s stake started unbonding; all its unbonding stake thaws at `thawAt`.
    event UnstakeRequested(address indexed account, uint256 amount, uint64 thawAt);
    /// @notice `account` withdrew `amount` of thawed stake.
    event StakeWithdrawn(address indexed account, uint256 amount);
    /// @notice `amount` of `account`'s stake was slashed and sent to `recipient`.
    event StakeSlashed(address indexed account, uint256 amount, address indexed recipient);

    /// @param token_ The stake token.
    /// @param unbondingPeriod_ Seconds an unstake request waits before withdrawal (> 0).
    /// @param admin Holder of the default admin role (grants MARKET_ROLE to the market).
    constructor(IERC20 token_, uint64 unbondingPeriod_, address admin) TypedSignatures("Veritrain StakeManager", "1") {
        if (address(token_) == address(0)) revert InvalidParameter("token");
        if (unbondingPeriod_ == 0) revert InvalidParameter("unbondingPeriod");
        if (admin == address(0)) revert InvalidParameter("admin");
        token = token_;
        unbondingPeriod = unbondingPeriod_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
    }

    // ----------------------------------------------------------------------------------------------
    // Staker actions
    // ----------------------------------------------------------------------------------------------

    /// @notice Bonds `amount` tokens of the caller (needs an allowance to this contract).
    function stake(uint256 amount) external nonReentrant {
        _stake(msg.sender, amount);
    }

    /// @notice Bonds `amount` tokens of `staker` using the staker's ERC-2612 permit to this contract.
    /// Anyone may relay; the permit signature is the staker's authorization.
    function stakeWithPermit(address staker, uint256 amount, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
        external
        nonReentrant
    {
        IERC20Permit(address(token)).permit(staker, address(this), amount, deadline, v, r, s);
        _stake(staker, amount);
    }

    /// @notice Moves `amount` of the caller's free stake to unbonding; restarts the thaw timer.
    function requestUnstake(uint256 amount) external {
        _requestUnstake(msg.sender, amount);
    }

    /// @notice Signed form of {requestUnstake}; anyone may relay.
    function requestUnstakeWithSig(
        address staker,
        uint256 amount,
        uint256 nonce,
        uint256 deadline,
        bytes calldata signature
    ) external {
        _useNonce(staker, nonce);
        bytes32 structHash = keccak256(abi.encode(REQUEST_UNSTAKE_TYPEHASH, staker, amount, nonce, deadline));
        _checkSignature(staker, structHash, deadline, signature);
        _requestUnstake(staker, amount);
    }

    /// @notice Withdraws all of the caller's thawed unbonding stake.
    function withdraw() external nonReentrant {
        _withdraw(msg.sender);
    }

    /// @notice Signed form of {withdraw}; anyone may relay, the tokens go to `staker`.
    function withdrawWithSig(address staker, uint256 nonce, uint256 deadline, bytes calldata signature)
        external
        nonReentrant
    {
        _useNonce(staker, nonce);
        _checkSignature(staker, keccak256(abi.encode(WITHDRAW_TYPEHASH, staker, nonce, deadline)), deadline, signature);
        _withdraw(staker);
    }

    // ----------------------------------------------------------------------------------------------
    // Market actions
    // ----------------------------------------------------------------------------------------------

    /// @notice Locks `amount` of `account`'s free stake as collateral.
    function lock(address account, uint256 amount) external onlyRole(MARKET_ROLE) {
        _lock(account, amount);
    }

    /// @notice Locks `amount` of each account's free stake (a unit's providers in one call); reverts
    /// entirely if any account lacks free stake.
    function lockBatch(address[] calldata accounts, uint256 amount) external onlyRole(MARKET_ROLE) {
        for (uint256 i; i < accounts.length; ++i) {
            _lock(accounts[i], amount);
        }
    }

    /// @notice Releases up to `amount` of `account`'s locked collateral.
    /// @dev Saturates instead of reverting: a settlement must never be blocked by a lock that a slash
    /// already consumed.
    function unlock(address account, uint256 amount) external onlyRole(MARKET_ROLE) {
        _unlock(account, amount);
    }

    /// @notice Releases up to `amount` of each account's locked collateral (saturating, as {unlock}).
    function unlockBatch(address[] calldata accounts, uint256 amount) external onlyRole(MARKET_ROLE) {
        for (uint256 i; i < accounts.length; ++i) {
            _unlock(accounts[i], amount);
        }
    }

    /// @notice Slashes up to `amount` of `account`'s stake, bonded first, then unbonding (unbonding stake
    /// stays slashable), and transfers the slashed tokens to `recipient`.
    /// @return slashed The amount actually taken (less than `amount` if the account holds less).
    function slash(address account, uint256 amount, address recipient)
        external
        onlyRole(MARKET_ROLE)
        nonReentrant
        returns (uint256 slashed)
    {
        StakeAccount storage acc = _accounts[account];
        uint128 bonded = acc.bonded;
        uint256 fromBonded = amount < bonded ? amount : bonded;
        uint128 newBonded = bonded - uint128(fromBonded);
        acc.bonded = newBonded;
        if (acc.locked > newBonded) acc.locked = newBonded;
        uint256 rest = amount - fromBonded;
        if (rest > 0) {
            uint128 unbonding = acc.unbonding;
            uint256 fromUnbonding = rest < unbonding ? rest : unbonding;
            acc.unbonding = unbonding - uint128(fromUnbonding);
            slashed = fromBonded + fromUnbonding;
        } else {
            slashed = fromBonded;
        }
        _totalStaked -= slashed;
        emit StakeSlashed(account, slashed, recipient);
        if (slashed > 0) token.safeTransfer(recipient, slashed);
    }

    // ----------------------------------------------------------------------------------------------
    // Views
    // ----------------------------------------------------------------------------------------------

    /// @notice The full stake position of `account`.
    function stakeOf(address account)
        external
        view
        returns (uint256 bonded, uint256 locked, uint256 unbonding, uint64 thawAt)
    {
        StakeAccount storage acc = _accounts[account];
        return (acc.bonded, acc.locked, acc.unbonding, acc.thawAt);
    }

    /// @inheritdoc TypedSignatures
    function nonces(address account) public view override returns (uint256) {
        return _nonces[account];
    }

    /// @notice Bonded stake of `account` (locked or not).
    function bondedOf(address account) external view returns (uint256) {
        return _accounts[account].bonded;
    }

    /// @notice Bonded stake of `account` that is not locked as collateral.
    function freeStake(address account) external view returns (uint256) {
        StakeAccount storage acc = _accounts[account];
        return acc.bonded - acc.locked;
    }

    /// @notice Sum of all bonded and unbonding stake (what this contract owes stakers).
    function totalStaked() external view returns (uint256) {
        return _totalStaked;
    }

    // ----------------------------------------------------------------------------------------------
    // Internals
    // ----------------------------------------------------------------------------------------------

    function _useNonce(address account, uint256 given) internal override {
        uint256 expected = _nonces[account];
        if (given != expected) revert InvalidNonce(account, expected, given);
        unchecked {
            _nonces[account] = expected + 1;
        }
    }

    function _stake(address staker, uint256 amount) private {
        if (amount == 0) revert ZeroAmount();
        StakeAccount storage acc = _accounts[staker];
        acc.bonded = SafeCast.toUint128(acc.bonded + amount);
        _totalStaked += amount;
        emit Staked(staker, amount);
        uint256 balanceBefore = token.balanceOf(address(this));
        token.safeTransferFrom(staker, address(this), amount);
        uint256 received = token.balanceOf(address(this)) - balanceBefore;
        if (received != amount) revert TransferAmountMismatch(amount, received);
    }

    function _lock(address account, uint256 amount) private {
        StakeAccount storage acc = _accounts[account];
        uint256 free = acc.bonded - acc.locked;
        if (amount > free) revert InsufficientFreeStake(account, free, amount);
        acc.locked += uint128(amount); // amount <= free < 2**128
    }

    function _unlock(address account, uint256 amount) private {
        StakeAccount storage acc = _accounts[account];
        uint128 locked = acc.locked;
        acc.locked = amount >= locked ? 0 : locked - uint128(amount);
    }

    function _requestUnstake(address staker, uint256 amount) private {
        if (amount == 0) revert ZeroAmount();
        StakeAccount storage acc = _accounts[staker];
        uint256 free = acc.bonded - acc.locked;
        if (amount > free) revert InsufficientFreeStake(staker, free, amount);
        acc.bonded -= uint128(amount); // amount <= free < 2**128
        acc.unbonding += uint128(amount);
        uint64 thawAt = uint64(block.timestamp) + unbondingPeriod;
        acc.thawAt = thawAt;
        emit UnstakeRequested(staker, amount, thawAt);
    }

    function _withdraw(address staker) private {
        StakeAccount storage acc = _accounts[staker];
        uint256 amount = acc.unbonding;
        if (amount == 0) revert NothingToWithdraw(staker);
        uint64 thawAt = acc.thawAt;
        if (block.timestamp < thawAt) revert StakeStillThawing(staker, thawAt);
        acc.unbonding = 0;
        acc.thawAt = 0;
        _totalStaked -= amount;
        emit StakeWithdrawn(staker, amount);
        token.safeTransfer(staker, amount);
    }
}
