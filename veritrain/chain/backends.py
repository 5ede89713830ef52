"""Where the chain runs: the in-process EVM, any JSON-RPC URL, or a local `hardhat node` we start ourselves.

Why three: fast tests and fuzzing want the in-process EVM (py-evm via eth-tester, no second process, but
nobody else can reach it); a user's default is a local Hardhat node that the client starts and stops (so
agents in other processes can share it); production is any JSON-RPC URL. All three hand out the same
`Backend` interface, and the dev accounts are the same keys on all of them (Hardhat's standard test
mnemonic), so a test means the same thing on every backend.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import HTTPProvider, Web3
from web3.types import RPCEndpoint, RPCResponse

from veritrain.chain.errors import ChainError, RpcUnavailable

# Hardhat's (and anvil's) well-known development mnemonic: public test keys, never for real money.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_HD_PATH = "m/44'/60'/0'/0"
DEV_ACCOUNT_COUNT = 20
HARDHAT_CHAIN_ID = 31337


@functools.lru_cache(maxsize=4)
def dev_accounts(count: int = DEV_ACCOUNT_COUNT) -> tuple[LocalAccount, ...]:
    """The first `count` keys of the dev mnemonic (funded on hardhat node, anvil and our in-process EVM)."""
    Account.enable_unaudited_hdwallet_features()
    return tuple(Account.from_mnemonic(DEV_MNEMONIC, account_path=f"{DEV_HD_PATH}/{i}") for i in range(count))


class Backend:
    """A connected chain: a `Web3` plus the few dev-chain controls tests and demos need (time, accounts)."""

    kind = "abstract"

    def __init__(self, w3: Web3) -> None:
        self.w3 = w3
        self._chain_id: int | None = None

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self.w3.eth.chain_id)
        return self._chain_id

    def dev_accounts(self, count: int = DEV_ACCOUNT_COUNT) -> tuple[LocalAccount, ...]:
        """Funded development accounts (the dev mnemonic's keys)."""
        return dev_accounts(count)

    def latest_timestamp(self) -> int:
        """Timestamp of the latest mined block (the next transaction runs at a later one)."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def advance_time(self, seconds: int) -> int:
        """Move the chain clock forward by `seconds` and mine a block; returns the new latest timestamp."""
        raise ChainError(f"{self.kind} backend cannot move time")

    def snapshot(self) -> Any:
        """Dev chains only: remember the whole chain state; `revert(snapshot_id)` returns to it."""
        raise ChainError(f"{self.kind} backend cannot take snapshots")

    def revert(self, snapshot_id: Any) -> None:
        """Dev chains only: return to a `snapshot()`; transactions since then are gone (resync nonces)."""
        raise ChainError(f"{self.kind} backend cannot revert to snapshots")

    def close(self) -> None:
        """Release what this backend holds (the in-process chain, an HTTP session)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# the requests whose missing `from` eth-tester's middleware fills (web3.providers.eth_tester.middleware)
_FROM_DEFAULTED = frozenset({"eth_call", "eth_estimateGas", "eth_sendTransaction", "eth_createAccessList"})


class InProcessBackend(Backend):
    """py-evm inside this process via eth-tester: fast, isolated, auto-mining one block per transaction."""

    kind = "inprocess"

    def __init__(self, accounts: int = DEV_ACCOUNT_COUNT) -> None:
        from eth_tester import EthereumTester, PyEVMBackend
        from web3 import EthereumTesterProvider
        from web3.middleware import Web3Middleware
        from web3.providers.eth_tester.middleware import ethereum_tester_middleware

        evm = PyEVMBackend.from_mnemonic(DEV_MNEMONIC, num_accounts=accounts, hd_path=DEV_HD_PATH)
        self.tester = EthereumTester(evm)
        default_from = self.tester.get_accounts()[0]

        class DefaultFrom(Web3Middleware):
            """What eth-tester's default-fields middleware does (a call, gas estimate or send without `from`
            is from the first account), with the account read once: that middleware asked the tester for
            every account twice per call, a fifth of `bench protocol --in-process`'s CPU. The tester's
            accounts are fixed at construction (nothing here adds one)."""

            def request_processor(self, method: RPCEndpoint, params: Any) -> Any:
                if method in _FROM_DEFAULTED and params[0].get("from") is None:
                    params = [{**params[0], "from": default_from}, *params[1:]]
                return method, params

        class SerializedProvider(EthereumTesterProvider):
            """py-evm is not thread-safe: one request at a time, so threaded senders stay correct."""

            _lock = threading.RLock()
            # (typed in web3 as exactly its own pair: this one stands in for its first)
            _middleware = (DefaultFrom, ethereum_tester_middleware)  # type: ignore[assignment]

            def make_request(self, method: Any, params: Any) -> Any:
                with self._lock:
                    return super().make_request(method, params)

        super().__init__(Web3(SerializedProvider(self.tester)))
        self._account_count = accounts

    def dev_accounts(self, count: int = DEV_ACCOUNT_COUNT) -> tuple[LocalAccount, ...]:
        if count > self._account_count:
            raise ChainError(f"the in-process chain funds {self._account_count} accounts, {count} requested")
        return dev_accounts(count)

    def advance_time(self, seconds: int) -> int:
        pending = int(self.tester.get_block_by_number("pending")["timestamp"])
        self.tester.time_travel(pending + int(seconds))
        return self.latest_timestamp()

    def snapshot(self) -> Any:
        return self.tester.take_snapshot()

    def revert(self, snapshot_id: Any) -> None:
        self.tester.revert_to_snapshot(snapshot_id)


class _TypedHTTPProvider(HTTPProvider):
    """Every transport failure (refused, reset, timeout: requests' errors are OSErrors) is RpcUnavailable,
    whichever call met it: a caller retries one typed error, and a raw one must never end an agent's loop
    (a reset under `ChainClient.now()` once did)."""

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        try:
            return super().make_request(method, params)
        except OSError as err:
            raise RpcUnavailable(f"{self.endpoint_uri}: {method}: {err}") from err


class RpcBackend(Backend):
    """Any JSON-RPC endpoint (hardhat node, anvil, geth, a testnet)."""

    kind = "rpc"

    def __init__(self, url: str, *, timeout: float = 10.0, check: bool = True) -> None:
        self.url = url
        super().__init__(Web3(_TypedHTTPProvider(url, request_kwargs={"timeout": timeout})))
        if check:
            try:
                _ = self.chain_id
            except (
                Exception
            ) as err:  # requests/aiohttp/socket errors differ by transport: one typed error out
                raise RpcUnavailable(f"no JSON-RPC node answers at {url}: {err}") from err

    def advance_time(self, seconds: int) -> int:
        """Dev nodes only (hardhat, anvil): evm_increaseTime + evm_mine."""
        self._dev_call("evm_increaseTime", [int(seconds)])
        self._dev_call("evm_mine", [])
        return self.latest_timestamp()

    def _dev_call(self, method: str, params: list[Any]) -> Any:
        try:
            response = self.w3.provider.make_request(method, params)  # type: ignore[arg-type]
        except Exception as err:
            raise RpcUnavailable(f"{self.url}: {method}: {err}") from err
        if "error" in response or "result" not in response:
            raise ChainError(f"{self.url}: {method} failed (not a dev node?): {response.get('error')}")
        return response["result"]

    def snapshot(self) -> Any:
        return self._dev_call("evm_snapshot", [])

    def revert(self, snapshot_id: Any) -> None:
        if self._dev_call("evm_revert", [snapshot_id]) is not True:
            raise ChainError(f"{self.url}: evm_revert({snapshot_id}) refused (unknown or used snapshot)")


def find_repo_root(start: Path | None = None) -> Path:
    """The checkout with hardhat.config.js + node_modules: $VERITRAIN_ROOT, else above this package or cwd."""
    env_root = os.environ.get("VERITRAIN_ROOT")
    if env_root:
        return Path(env_root).resolve()
    candidates = [start] if start else []
    candidates += [Path(__file__).resolve(), Path.cwd().resolve()]
    for candidate in candidates:
        for folder in [candidate, *candidate.parents]:
            if (folder / "hardhat.config.js").is_file() and (
                folder / "node_modules" / ".bin" / "hardhat"
            ).exists():
                return folder
    raise ChainError(
        "cannot find the Veritrain checkout (hardhat.config.js + node_modules); "
        "set VERITRAIN_ROOT or run scripts/setup"
    )


def free_port() -> int:
    """A TCP port that was free a moment ago (the node may still lose a race; start() retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LIVE_NODES: weakref.WeakSet[HardhatNode] = weakref.WeakSet()


@atexit.register
def _stop_live_nodes() -> None:
    for node in list(_LIVE_NODES):
        node.stop()


class HardhatNode:
    """A `hardhat node` child process that this object starts, waits for and stops by its own PID.

    Use as a context manager; an interpreter exit also stops it, so no run leaves an orphan node behind.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        root: Path | None = None,
        startup_timeout: float = 60.0,
        log_path: Path | None = None,
    ) -> None:
        self.root = root or find_repo_root()
        self.requested_port = port
        self.port = 0
        self.startup_timeout = startup_timeout
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> HardhatNode:
        """Start the node; return once it answers eth_chainId, else RpcUnavailable with the node's log."""
        if self._popen is not None:
            return self
        attempts = 1 if self.requested_port else 3
        last_error: RpcUnavailable | None = None
        for _ in range(attempts):
            try:
                self._start_once(self.requested_port or free_port())
                return self
            except RpcUnavailable as err:
                if "EADDRINUSE" not in str(err):
                    raise
                last_error = err  # another process took the port between our probe and the node's bind
        assert last_error is not None
        raise last_error

    def _start_once(self, port: int) -> None:
        hardhat = self.root / "node_modules" / ".bin" / "hardhat"
        if not hardhat.exists():
            raise RpcUnavailable(f"{hardhat} is missing: run scripts/setup (npm ci) first")
        self.port = port
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"hardhat-node-{port}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self._log = self.log_path.open("ab")
        env = dict(os.environ, HARDHAT_DISABLE_TELEMETRY_PROMPT="true")
        self._popen = subprocess.Popen(
            [str(hardhat), "node", "--hostname", "127.0.0.1", "--port", str(port)],
            cwd=str(self.root),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE_NODES.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._popen is not None
        probe = Web3(HTTPProvider(self.url, request_kwargs={"timeout": 1.0}))
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._popen.poll() is not None:
                raise RpcUnavailable(
                    f"hardhat node (pid {self._popen.pid}) exited with code {self._popen.returncode} "
                    f"before answering; log {self.log_path}:\n{self.log_tail()}"
                )
            with contextlib.suppress(Exception):  # not listening yet: connection refused, reset, timeout
                if int(probe.eth.chain_id) > 0:
                    return
            if time.monotonic() > deadline:
                raise RpcUnavailable(
                    f"hardhat node (pid {self._popen.pid}) did not answer eth_chainId on {self.url} within "
                    f"{self.startup_timeout:g} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the node's process group (its own session): SIGSTOP freezes the chain, state and all,
        until SIGCONT (the chaos bench's EVM-node fault)."""
        if self._popen is None or self._popen.poll() is not None:
            raise RpcUnavailable("the hardhat node is not running")
        os.killpg(self._popen.pid, sig)

    def log_tail(self, max_bytes: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[-max_bytes:].decode("utf-8", errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process we started (its PID only), SIGKILL after `timeout`; idempotent."""
        popen, self._popen = self._popen, None
        _LIVE_NODES.discard(self)
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGKILL)
                popen.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def backend(self) -> RpcBackend:
        """A backend connected to this node."""
        return RpcBackend(self.url)

    def __enter__(self) -> HardhatNode:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        popen = self.__dict__.get("_popen")
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(Exception):
                popen.kill()


@contextlib.contextmanager
def open_backend(
    rpc: str | None = None, *, in_process: bool = False, **node_options: Any
) -> Iterator[Backend]:
    """The user's default chain: `rpc` if given, the in-process EVM if asked, else a hardhat node we run."""
    if rpc and in_process:
        raise ChainError("choose either an RPC URL or the in-process EVM, not both")
    if rpc:
        with RpcBackend(rpc) as backend:
            yield backend
    elif in_process:
        with InProcessBackend() as backend:
            yield backend
    else:
        with HardhatNode(**node_options) as node, node.backend() as backend:
            yield backend
