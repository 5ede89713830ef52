"""One exception tree for all of Veritrain: callers catch `VeritrainError` or a precise subclass.

Each area adds its own subclasses in its own section below.
"""

from __future__ import annotations


class VeritrainError(Exception):
    """Base of every error Veritrain raises on purpose."""


class InvalidInput(VeritrainError):
    """Input from another party or a user is malformed, oversized or inconsistent."""


# --- agents, demo and child processes (agentkit.py, node/agent.py, verifier/agent.py, apps/demo.py,
# apps/procs.py)


class ProcessError(VeritrainError):
    """A child process the orchestrator started could not be started, became unhealthy or exited."""


class ChildProcessExited(ProcessError):
    """A supervised child process exited while it was still needed (its log tail is in the message)."""


class ReadinessTimeout(ProcessError):
    """A child process did not pass its health check before the deadline."""


class AgentError(VeritrainError):
    """A provider or verifier agent met a condition it cannot continue from (bad config, market refusal)."""


class DemoCheckFailed(VeritrainError):
    """An acceptance check of `veritrain demo` failed (the report says which)."""


# --- keys and configuration (keys.py, settings.py)


class KeystoreError(InvalidInput):
    """A key could not be loaded: missing file, not a keystore or key, or no passphrase available."""


class WrongPassphrase(KeystoreError):
    """The passphrase does not decrypt the keystore (its MAC does not match)."""


class ConfigError(InvalidInput):
    """The configuration file or environment holds a value Veritrain cannot use."""


# --- market (control plane) and signed agent messages ---------------------------------------------


class InvalidSignature(InvalidInput):
    """A signed message does not recover to the address it claims to come from."""


class NotAuthorized(InvalidInput):
    """A correctly signed message from a signer the market does not accept it from."""


class RateLimited(VeritrainError):
    """Too many requests from one client: an endpoint that costs the server RPC calls is rationed."""


class ReplayedMessage(InvalidInput):
    """A signed message reuses a nonce or timestamp already seen from its signer, or is too old/new."""


class MarketError(VeritrainError):
    """The market refused or could not perform an operation."""


class IllegalTransition(MarketError):
    """An order, round or unit was asked to move to a state its state machine does not allow from here."""


class NotFound(MarketError):
    """A referenced order, unit, agent or job does not exist in the market store."""


class UnderfundedOrder(InvalidInput):
    """An order's on-chain escrow does not cover its units, replicas and verifier fees at its max price."""


class InvalidOrderSpec(InvalidInput):
    """A buyer's order file is malformed, names an unknown field, or its deadline has passed."""


class OrderMismatch(InvalidInput):
    """An order's off-chain spec does not match the on-chain order it names (spec hash, units, replicas)."""


# --- training (recipes, datasets, proof-of-learning, unit execution) ---


class UnknownRecipe(InvalidInput):
    """An order or unit names a recipe that is not in the registry (providers never run buyer code)."""


class DatasetUnavailable(VeritrainError):
    """A recipe's dataset cannot be built on this machine (a file or package it reads is missing)."""


class DatasetMismatch(InvalidInput):
    """A dataset's content digest differs from the digest the order or unit names."""


class InvalidState(InvalidInput):
    """A training state (weights + optimizer state) does not fit its recipe: missing, extra or misshaped."""


class CheckpointError(InvalidInput):
    """A checkpoint file is unreadable, or belongs to another unit than the one being resumed."""


class UnitStopped(VeritrainError):
    """A unit run stopped on request before its last step; its checkpoints so far stay in the workdir."""

    def __init__(self, step: int) -> None:
        super().__init__(f"unit stopped after step {step}")
        self.step = step


class DeviceUnavailable(VeritrainError):
    """The requested device does not exist here or its driver failed when probed (no unit was started)."""


class DeviceUnsuitable(VeritrainError):
    """The device cannot run this recipe (e.g. its memory estimate exceeds free memory); refused up front."""


class AggregateMismatch(InvalidInput):
    """The inputs of a DiLoCo aggregate unit do not fit together (shapes, names, digests or round)."""


# --- data plane (codec, blob store, libp2p blob protocol) ---


class DecodeError(InvalidInput):
    """Bytes from another party are not a valid frame or message (oversized, malformed, wrong types)."""


class EncodeError(InvalidInput):
    """A value cannot be put on the wire: a frame over its cap, or an int outside uint256."""


class UnboundResult(InvalidInput):
    """A reported state digest and transcript root do not hash to the result digest they claim to make up
    (sha256(domain ‖ state ‖ root)): accepting them would let a replica steer the next round."""


class InvalidDigest(InvalidInput):
    """A blob digest is not 64 lowercase hex characters (sha256)."""


class DigestMismatch(InvalidInput):
    """Blob bytes do not hash to the digest they were stored or served under (corruption or a lying peer)."""


class BlobNotFound(VeritrainError):
    """The local store or the remote peer has no blob with this digest."""


class P2PError(VeritrainError):
    """The data plane failed: a peer is unreachable, timed out, or broke the protocol."""


class RequestDenied(P2PError):
    """The serving peer refused a blob request: bad signature, stale or replayed request, or not allowed."""


class FetchIncomplete(P2PError):
    """The exchange ended without an answer about the blob: unreachable, timed out, connection lost,
    stream cut short, or the peer said it is busy. Not evidence against the peer (a third party may
    cause it): retry later."""


class PeerBusy(FetchIncomplete):
    """The serving peer answered that it is at capacity or that this requester is over its rate limit."""


# --- verification (verifier core, tolerance calibration, attack benchmark) ---


class ToleranceUnavailable(VeritrainError):
    """No calibrated tolerance exists for this recipe, or the tolerance data is malformed."""


class BenchWorkerFailed(VeritrainError):
    """A benchmark worker subprocess (one per hardware configuration) died or reported an error."""
