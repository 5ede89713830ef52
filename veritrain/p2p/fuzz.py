"""Coverage-guided fuzzing (atheris) of the path every peer byte takes: length prefix -> msgpack -> model.

    python -m veritrain.p2p.fuzz soak --runs 1000000 --json out.json   # what scripts/soak-decoder runs

`soak` starts the fuzz target in a child process under libFuzzer's RSS cap (`-rss_limit_mb`) and reports
executions, crashes, the child's peak RSS and the wall time. Each input is checked by `check_input`:

- byte 0 picks a wire message type and the caps production reads it under, byte 1 how a stream splits the
  rest into reads; the rest is what the peer sent;
- the one-shot decoder (`decode_message_frame`) and the streaming one (`FrameReader`) must agree: a
  complete single frame decodes to the same model both ways, and each fails only with `DecodeError`;
- a decoded model must re-encode to bytes that decode to an equal model;
- the streaming reader never reads past the frame it declared, nor more than the cap allows.

Any other exception is a crash, an input slower than 10 s a timeout (libFuzzer saves either input in the
child's working directory; `soak` prints it). Coverage feedback comes from our own decoding code (codec,
messages, this oracle): msgpack and pydantic-core are compiled and not instrumented, so inside them the
search is blind mutation around the seeds.
atheris is a development dependency: only the `target` command imports it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import inspect
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from veritrain.codec import (
    DEFAULT_LIMITS,
    CodecLimits,
    FrameReader,
    Uint256,
    WireModel,
    decode,
    decode_message_frame,
    encode,
    encode_message_frame,
    parse_frame_header,
)
from veritrain.errors import DecodeError

__all__ = ["FuzzReport", "check_input", "seed_inputs", "soak"]


class _Probe(WireModel):
    """Exercises the codec's other field types (uint256, nested tuples, optional, float) on the wire."""

    amount: Uint256
    parts: tuple[tuple[int, ...], ...]
    label: Annotated[str, Field(max_length=64)] | None = None
    ratio: Annotated[float, Field(allow_inf_nan=False)] = 0.0


def _targets() -> list[tuple[type[BaseModel], CodecLimits]]:
    """Each wire message type with the caps its reader uses in production."""
    from veritrain.agentkit import MANIFEST_INDEX_LIMITS_BYTES, ManifestAnswer, ManifestQuery
    from veritrain.p2p.blob_protocol import REQUEST_LIMITS
    from veritrain.p2p.messages import BlobChunk, BlobRequest, BlobResponse

    manifest = CodecLimits(max_frame_bytes=MANIFEST_INDEX_LIMITS_BYTES, max_depth=2)
    return [
        (BlobRequest, REQUEST_LIMITS),
        (BlobResponse, DEFAULT_LIMITS),
        (BlobChunk, DEFAULT_LIMITS),
        (ManifestQuery, manifest),
        (ManifestAnswer, manifest),
        (_Probe, CodecLimits(max_depth=4)),
    ]


class _ChunkedSource:
    """Serves `data` in reads whose sizes follow `pattern` (as a network splits a stream); b"" at the end."""

    def __init__(self, data: bytes, pattern: int, cap: int) -> None:
        self._data = data
        self._pattern = pattern
        self._cap = cap
        self.consumed = 0
        self.requested: list[int] = []

    async def read(self, n: int) -> bytes:
        self.requested.append(n)
        if n > self._cap + 10:
            raise AssertionError(f"reader asked for {n} bytes under a {self._cap}-byte frame cap")
        size = min(n, 1 + (self._pattern * (len(self.requested) + 7)) % 97)
        part = self._data[self.consumed : self.consumed + size]
        self.consumed += len(part)
        return part


def _run_sync(coroutine: Coroutine[Any, Any, BaseModel]) -> BaseModel:
    """Run a coroutine that never suspends (its source answers at once) without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the frame reader suspended on an in-memory source")


def check_input(data: bytes) -> None:
    """The fuzz oracle for one input (module docstring); raises anything but DecodeError on a finding."""
    if len(data) < 2:
        return
    targets = _targets_cached()
    model_type, limits = targets[data[0] % len(targets)]
    wire = data[2:]

    one_shot: BaseModel | None = None
    with contextlib.suppress(DecodeError):
        one_shot = decode_message_frame(wire, model_type, limits)

    source = _ChunkedSource(wire, data[1], limits.max_frame_bytes)
    streamed: BaseModel | None = None
    with contextlib.suppress(DecodeError):
        streamed = _run_sync(FrameReader(source, limits.max_frame_bytes).read_message(model_type, limits))
    header = parse_frame_header(wire, limits.max_frame_bytes) if streamed is not None else None
    if header is not None and source.consumed != sum(header):
        raise AssertionError(f"reader consumed {source.consumed} bytes of a {sum(header)}-byte frame")

    if one_shot is not None and streamed != one_shot:
        raise AssertionError(f"one-shot decoded {one_shot!r}, streaming {streamed!r}")
    if streamed is not None and source.consumed == len(wire) and one_shot is None:
        raise AssertionError("streaming decoded a complete frame the one-shot decoder refused")
    if streamed is not None:
        try:
            again = decode(encode(streamed), model_type, limits)
        except DecodeError as exc:
            raise AssertionError(f"{streamed!r} re-encodes to bytes its own decoder refuses") from exc
        if again != streamed:
            raise AssertionError(f"{streamed!r} does not survive a re-encode")


_PEAK_RSS_PREFIX = "veritrain-fuzz peak_rss_kib="
_TARGETS: list[tuple[type[BaseModel], CodecLimits]] = []


def _targets_cached() -> list[tuple[type[BaseModel], CodecLimits]]:
    if not _TARGETS:
        _TARGETS.extend(_targets())
    return _TARGETS


def seed_inputs() -> list[bytes]:
    """One valid input per target, so the fuzzer starts from real messages rather than noise."""
    from eth_account import Account

    from veritrain.agentkit import ManifestAnswer, ManifestQuery
    from veritrain.p2p.messages import BlobChunk, BlobResponse, sign_blob_request

    digest = "ab" * 32
    messages: list[BaseModel] = [
        sign_blob_request(Account.from_key(b"\x01" * 32), digest, "QmSeedPeer", timestamp=1_700_000_000),
        BlobResponse(status="ok", size=123, detail=""),
        BlobChunk(data=b"chunk bytes"),
        ManifestQuery(result_digest=digest),
        ManifestAnswer(status="ok", manifest_digest=digest),
        _Probe(amount=2**255 + 7, parts=((1, 2), (), (3,)), label="x", ratio=0.5),
    ]
    return [bytes([index, 1]) + encode_message_frame(m) for index, m in enumerate(messages)]


class FuzzReport(BaseModel):
    """What one soak run did; `crashes` counts saved crash/timeout/oom inputs and a failed exit;
    `peak_rss_mib` is the fuzzing process's own peak (0 if it died before reporting it)."""

    executions: int
    crashes: int
    peak_rss_mib: float
    wall_s: float
    exit_code: int
    seed: int
    rss_limit_mb: int


def soak(runs: int, *, rss_limit_mb: int = 256, seed: int = 1, timeout_s: float = 3600.0) -> FuzzReport:
    """Fuzz `runs` inputs in a child process; its stderr goes to ours, findings stay in a temp folder."""
    with tempfile.TemporaryDirectory(prefix="veritrain-fuzz-") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        for index, data in enumerate(seed_inputs()):
            (corpus / f"seed-{index}").write_bytes(data)
        # Linux carries a process's peak RSS across fork and exec, so a child of a big process (a test
        # run that loaded torch) would start "over" the cap; a small shell in between forks it afresh.
        command = [
            "/bin/sh",
            "-c",
            '"$@"; exit $?',
            "sh",
            sys.executable,
            "-m",
            "veritrain.p2p.fuzz",
            "target",
            f"-atheris_runs={runs}",
            f"-rss_limit_mb={rss_limit_mb}",
            f"-seed={seed}",
            "-max_len=8192",
            "-timeout=10",
            "-print_final_stats=1",
            str(corpus),
        ]
        started = time.monotonic()
        result = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=timeout_s)
        wall_s = time.monotonic() - started
        sys.stderr.write(result.stderr[-4000:])
        peak = re.findall(rf"{_PEAK_RSS_PREFIX}(\d+)", result.stderr)
        findings = [p for p in Path(tmp).iterdir() if p.name.startswith(("crash-", "timeout-", "oom-"))]
        done = re.findall(r"Done (\d+) (?:runs )?in", result.stderr)
        executions = int(done[-1]) if done else 0
        crashes = len(findings) + (1 if result.returncode != 0 and not findings else 0)
        for finding in findings:
            sys.stderr.write(f"finding {finding.name}: {finding.read_bytes()[:200]!r}\n")
    return FuzzReport(
        executions=executions,
        crashes=crashes,
        peak_rss_mib=round(int(peak[-1]) / 1024, 1) if peak else 0.0,
        wall_s=round(wall_s, 1),
        exit_code=result.returncode,
        seed=seed,
        rss_limit_mb=rss_limit_mb,
    )


def _target(argv: list[str]) -> None:
    import atheris

    import veritrain.codec
    import veritrain.p2p.messages

    # Coverage feedback from our decoding code only (msgpack and pydantic-core are compiled, and
    # instrumenting every loaded module costs minutes at start-up).
    for module in (veritrain.codec, veritrain.p2p.messages, sys.modules[__name__]):
        for value in list(vars(module).values()):
            functions = vars(value).values() if isinstance(value, type) else [value]
            for function in functions:
                if inspect.isfunction(function) and function.__module__ == module.__name__:
                    atheris.instrument_func(function)
    _targets_cached()
    atexit.register(_at_exit)
    atheris.Setup([sys.argv[0], *argv], check_input)
    atheris.Fuzz()


def _at_exit() -> None:
    """Stop libFuzzer's per-input alarm (SIGALRM could otherwise kill the finishing interpreter), then
    report this process's peak RSS to the parent."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    print(f"{_PEAK_RSS_PREFIX}{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["target"]:
        _target(args[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m veritrain.p2p.fuzz")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("soak", help="fuzz the decoder in a child process and report")
    run.add_argument("--runs", type=int, default=1_000_000)
    run.add_argument("--rss-limit-mb", type=int, default=256)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--json", help="also write the report to this file")
    parsed = parser.parse_args(args)
    report = soak(parsed.runs, rss_limit_mb=parsed.rss_limit_mb, seed=parsed.seed)
    text = report.model_dump_json(indent=2)
    print(text)
    if parsed.json:
        Path(parsed.json).write_text(text + "\n")
    return 0 if report.crashes == 0 and report.executions >= parsed.runs else 1


if __name__ == "__main__":
    sys.exit(main())
