// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @title TypedSignatures
/// @notice Shared EIP-712 checks for every `...WithSig` action of the Veritrain contracts, so that both
/// contracts reject bad signatures with the same three errors.
/// @dev Each signed message carries an explicit per-account `nonce` and an inclusive `deadline`; the
/// caller passes both, so a replay is reported as {InvalidNonce} (not as a confusing wrong signer) and a
/// signature made for another chain id or contract recovers another address ({InvalidSigner}).
abstract contract TypedSignatures is EIP712 {
    /// @notice The recovered signer differs from the party the action is for (or the signature is malformed,
    /// then `recovered` is the zero address).
    error InvalidSigner(address expected, address recovered);
    /// @notice The signature's deadline has passed (`deadline` is the last valid second).
    error SignatureExpired(uint256 deadline, uint256 now);
    /// @notice The signed nonce is not the account's next nonce (a replay, or out of order).
    error InvalidNonce(address account, uint256 expected, uint256 given);

    constructor(string memory name, string memory version) EIP712(name, version) {}

    /// @notice The next nonce `account` must sign.
    /// @dev Each contract stores its nonces itself (JobMarket packs them with other per-account data).
    function nonces(address account) public view virtual returns (uint256);

    /// @dev Consumes `account`'s nonce `given` or reverts with {InvalidNonce}.
    function _useNonce(address account, uint256 given) internal virtual;

    /// @dev Reverts unless `signature` over the typed `structHash` was made by `expected` no later than
    /// `deadline`. Returns nothing: callers consume the nonce themselves, before this check.
    function _checkSignature(address expected, bytes32 structHash, uint256 deadline, bytes calldata signature)
        internal
        view
    {
        if (block.timestamp > deadline) revert SignatureExpired(deadline, block.timestamp);
        address recovered = _recover(structHash, signature);
        if (recovered == address(0) || recovered != expected) revert InvalidSigner(expected, recovered);
    }

    /// @dev The signer of the typed `structHash`, or the zero address for a malformed signature.
    function _recover(bytes32 structHash, bytes calldata signature) internal view returns (address recovered) {
        (recovered,,) = ECDSA.tryRecoverCalldata(_hashTypedDataV4(structHash), signature);
    }
}
