// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// Minimal stake registry with an epoch-level lock: stake is bonded until an unstake request, and unbonding
/// stake stays slashable for `unbondingPeriod` (longer than a round's settlement), so a market checks
/// `bondedOf` once per provider per round instead of locking collateral per unit.
contract RoundStake {
    using SafeERC20 for IERC20;

    struct Acc {
        uint128 bonded;
        uint128 unbonding;
        uint64 thawAt;
    }

    IERC20 public immutable token;
    uint64 public immutable unbondingPeriod;
    address public immutable admin;
    mapping(address => bool) public isMarket;
    mapping(address => Acc) private _accs;

    error NotMarket();
    error Insufficient();
    error Thawing();

    constructor(IERC20 token_, uint64 unbondingPeriod_) {
        token = token_;
        unbondingPeriod = unbondingPeriod_;
        admin = msg.sender;
    }

    function addMarket(address market) external {
        require(msg.sender == admin);
        isMarket[market] = true;
    }

    function stake(uint256 amount) external {
        _accs[msg.sender].bonded += uint128(amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    function requestUnstake(uint256 amount) external {
        Acc storage a = _accs[msg.sender];
        if (a.bonded < amount) revert Insufficient();
        a.bonded -= uint128(amount);
        a.unbonding += uint128(amount);
        a.thawAt = uint64(block.timestamp) + unbondingPeriod;
    }

    function withdraw() external {
        Acc storage a = _accs[msg.sender];
        if (block.timestamp < a.thawAt) revert Thawing();
        uint256 amount = a.unbonding;
        a.unbonding = 0;
        token.safeTransfer(msg.sender, amount);
    }

    /// Stake that cannot leave before `block.timestamp + unbondingPeriod`.
    function bondedOf(address account) external view returns (uint256) {
        return _accs[account].bonded;
    }

    /// Slashes bonded stake first, then unbonding stake (still slashable while thawing).
    function slash(address account, uint256 amount, address to) external returns (uint256 slashed) {
        if (!isMarket[msg.sender]) revert NotMarket();
        Acc storage a = _accs[account];
        uint256 fromBonded = amount <= a.bonded ? amount : a.bonded;
        a.bonded -= uint128(fromBonded);
        uint256 rest = amount - fromBonded;
        uint256 fromUnbonding = rest <= a.unbonding ? rest : a.unbonding;
        a.unbonding -= uint128(fromUnbonding);
        slashed = fromBonded + fromUnbonding;
        token.safeTransfer(to, slashed);
    }
}
