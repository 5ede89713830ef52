// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title RefusingToken (test mock)
/// @notice A token that refuses transfers to chosen recipients (as a token with a blocklist would), by
/// reverting (`how` 1) or by returning false (`how` 2), so a test can see that a close paying such a
/// recipient still closes and keeps its pay as a credit.
contract RefusingToken is ERC20 {
    mapping(address => uint8) public refusal;

    constructor() ERC20("Refusing", "REF") {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    function refuse(address account, uint8 how) external {
        refusal[account] = how;
    }

    function transfer(address to, uint256 value) public override returns (bool) {
        uint8 how = refusal[to];
        if (how == 1) revert("refused");
        if (how == 2) return false;
        return super.transfer(to, value);
    }
}
