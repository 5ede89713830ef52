// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {TimelockController} from "@openzeppelin/contracts/governance/TimelockController.sol";

/// @title AdminTimelock
/// @notice Holds the admin roles of StakeManager and JobMarket after deployment, so a role grant (say,
/// MARKET_ROLE, which can slash any staker) takes effect only `minDelay` seconds after it was scheduled
/// in public: stakers see it coming and can unbond before it lands. OpenZeppelin's TimelockController
/// unchanged; this contract exists so Hardhat compiles it and the Python deployment can ship its bytecode.
contract AdminTimelock is TimelockController {
    constructor(uint256 minDelay, address[] memory proposers, address[] memory executors)
        TimelockController(minDelay, proposers, executors, address(0))
    {}
}
