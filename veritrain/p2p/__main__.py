"""`python -m veritrain.p2p serve|bench`: a standalone blob server, and the loopback throughput benchmark.

serve: serves a BlobStore folder, prints ``P2P_ADDRESS <multiaddr>`` once listening, and runs until
stdin closes or SIGTERM/SIGINT arrives (so a parent process can stop it by closing the pipe).
bench: starts `serve` in a second process, fetches a random blob from it several times and prints
MiB/s: two processes, as between real agents (one process would share the GIL between both hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from veritrain.p2p.process import READY_PREFIX, start_server_process, stop_server_process


def _serve(args: argparse.Namespace) -> int:
    from eth_account import Account

    from veritrain.blobstore import BlobStore
    from veritrain.p2p.identity import load_or_create_peer_key
    from veritrain.p2p.node import P2PNode

    peer_key = load_or_create_peer_key(args.peer_key_file) if args.peer_key_file else None
    node = P2PNode(Account.create(), peer_key=peer_key, store=BlobStore(args.store), listen_addr=args.listen)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def wait_for_stdin_eof() -> None:
        sys.stdin.read()
        stop.set()

    address = node.start()
    try:
        print(READY_PREFIX + address, flush=True)
        threading.Thread(target=wait_for_stdin_eof, daemon=True).start()
        stop.wait()
    finally:
        node.stop()
    return 0


def _bench(args: argparse.Namespace) -> int:
    from eth_account import Account

    from veritrain.blobstore import BlobStore
    from veritrain.p2p.node import P2PNode

    size = int(args.mib * (1 << 20))
    with tempfile.TemporaryDirectory(prefix="veritrain-p2p-bench-") as tmp:
        digest = BlobStore(Path(tmp) / "store").put(os.urandom(size))
        process, address = start_server_process(Path(tmp) / "store")
        try:
            with P2PNode(Account.create()) as client:
                started = time.perf_counter()
                client.fetch(address, digest)  # includes the one dial
                first_s = time.perf_counter() - started
                seconds = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    client.fetch(address, digest)
                    seconds.append(time.perf_counter() - started)
        finally:
            stop_server_process(process)
    mib = size / (1 << 20)
    result = {
        "blob_mib": mib,
        "first_fetch_s": round(first_s, 4),
        "median_mib_per_s": round(mib / statistics.median(seconds), 1),
        "best_mib_per_s": round(mib / min(seconds), 1),
        "repeats": args.repeat,
    }
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m veritrain.p2p")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a blob store folder over /veritrain/blob/1.0.0")
    serve.add_argument("--store", required=True, help="BlobStore root directory")
    serve.add_argument("--peer-key-file", help="peer identity seed file (created if absent)")
    serve.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="listen multiaddr")
    serve.set_defaults(handler=_serve)
    bench = commands.add_parser("bench", help="loopback throughput between two processes")
    bench.add_argument("--mib", type=float, default=8.0, help="blob size in MiB")
    bench.add_argument("--repeat", type=int, default=5, help="timed fetches after the first")
    bench.add_argument("--json", help="also write the result to this file")
    bench.set_defaults(handler=_bench)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
