// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title ReentrantToken (test mock)
/// @notice A malicious token: on every `transfer` it calls back into `hookTarget` with `hookData`
/// (for example `withdrawCredit()` of the paying contract) and records whether that re-entry succeeded,
/// without reverting itself, so a test can see the re-entry was refused and the payment still happened.
contract ReentrantToken is ERC20 {
    address public hookTarget;
    bytes public hookData;
    bool private _inHook;
    uint256 public hookCalls;
    bool public lastHookSucceeded;
    bytes public lastHookReturn;

    constructor() ERC20("Reentrant", "RET") {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    function setHook(address target, bytes calldata data) external {
        hookTarget = target;
        hookData = data;
    }

    function transfer(address to, uint256 value) public override returns (bool) {
        bool ok = super.transfer(to, value);
        if (hookTarget != address(0) && !_inHook) {
            _inHook = true;
            (lastHookSucceeded, lastHookReturn) = hookTarget.call(hookData);
            hookCalls += 1;
            _inHook = false;
        }
        return ok;
    }
}
