// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title VeriToken
/// @notice The development payment and stake token of Veritrain: a plain ERC-20 with ERC-2612 permit,
/// so providers can stake through a relayer without holding gas. The markets accept any ERC-20; this
/// token only exists so a local chain has one.
contract VeriToken is ERC20, ERC20Permit, Ownable {
    /// @notice Deploys the token with the deployer as owner (the development faucet).
    constructor() ERC20("Veritrain Token", "VERI") ERC20Permit("Veritrain Token") Ownable(msg.sender) {}

    /// @notice Mints `amount` base units to `to`. Development faucet, owner only.
    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
