// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title ReturnFalseToken (test mock)
/// @notice A token that reports failure by returning false instead of reverting (like ZRX), to show the
/// contracts' SafeERC20 calls revert instead of booking money that never moved.
contract ReturnFalseToken is ERC20 {
    constructor() ERC20("Return False", "RFT") {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    function transfer(address, uint256) public pure override returns (bool) {
        return false;
    }

    function transferFrom(address, address, uint256) public pure override returns (bool) {
        return false;
    }
}
