"""Coverage-guided fuzzing (atheris) of what a peer's bytes go through, as two targets:

    python -m veritrain.p2p.fuzz soak --runs 1000000 --json out.json   # decoder (scripts/soak-decoder)
    python -m veritrain.p2p.fuzz soak --target codec --runs 1000000    # the msgpack codec (scripts/soak)

`soak` starts the fuzz target in a child process under libFuzzer's RSS cap (`-rss_limit_mb`) and reports
executions, crashes, the child's peak RSS and the wall time.

**decoder** (length prefix -> msgpack -> typed model): each input is checked by `check_input`:

- byte 0 picks a wire message type and the caps production reads it under, byte 1 how a stream splits the
  rest into reads; the rest is what the peer sent;
- the one-shot decoder (`decode_message_frame`) and the streaming one (`FrameReader`) must agree: a
  complete single frame decodes to the same model both ways, and each fails only with `DecodeError`;
- a decoded model must re-encode to bytes that decode to an equal model;
- the streaming reader never reads past the frame it declared, nor more than the cap allows.

**codec** (`veritrain.codec` below the models): each input is checked by `check_codec_input`; byte 0
picks a mode, byte 1 the caps (`CodecLimits`) it runs under:

- unpack: untrusted bytes either raise `DecodeError` or give only what the codec promises: tuples, not
  lists; string map keys; no ext types; every length and the nesting depth within the caps; a value
  that re-packs and re-reads to the same bytes;
- pack: a value built from the input (any nesting, ints beyond 64 bits, NaN, lone surrogates, foreign
  types) either raises `EncodeError` or packs to bytes that `unpack` reads back to the same value when
  the value is wire-legal (string keys, depth within the cap) and refuses with `DecodeError` otherwise;
- helpers: the uint256 decimal/bytes forms and the frame header accept only their canonical form and
  round-trip it.

Any other exception is a crash, an input slower than 10 s a timeout (libFuzzer saves either input in the
child's working directory; `soak` prints it). Coverage feedback comes from our own decoding code (codec,
messages, this oracle): msgpack and pydantic-core are compiled and not instrumented, so inside them the
search is blind mutation around the seeds, helped by a dictionary of msgpack markers (`msgpack_tokens`).
atheris is a development dependency: only the `target` command imports it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import inspect
import math
import re
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

from pydantic import BaseModel, Field

import veritrain.codec
from veritrain.codec import (
    DEFAULT_LIMITS,
    MAX_FRAME_BYTES,
    CodecLimits,
    FrameReader,
    Uint256,
    WireModel,
    decode,
    decode_frame,
    decode_message_frame,
    encode,
    encode_frame,
    encode_message_frame,
    pack,
    parse_frame_header,
    uint256_from_bytes,
    uint256_from_decimal,
    uint256_to_bytes,
    uint256_to_decimal,
    unpack,
)
from veritrain.errors import DecodeError, EncodeError

__all__ = [
    "TARGETS",
    "FuzzReport",
    "check_codec_input",
    "check_input",
    "codec_seed_inputs",
    "seed_inputs",
    "soak",
]


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


# --- codec target ------------------------------------------------------------------------------------

_CODEC_LIMITS = (
    DEFAULT_LIMITS,
    CodecLimits(max_frame_bytes=4096, max_depth=2),  # a blob request's caps
    CodecLimits(
        max_frame_bytes=64, max_depth=3, max_str_len=8, max_bin_len=8, max_array_len=4, max_map_len=2
    ),
)
_PLAIN_TYPES = (type(None), bool, int, float, str, bytes)


class _Cursor:
    """Reads the fuzz input as a stream of choices; past its end every read is zeros."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, n: int) -> bytes:
        part = self._data[self._pos : self._pos + n]
        self._pos += n
        return part.ljust(n, b"\x00")

    def byte(self) -> int:
        return self.take(1)[0]


def _build(cursor: _Cursor, depth: int = 0) -> Any:
    """A value for `pack`, drawn from the input: plain values, containers up to 20 deep, and the awkward
    cases (ints past 64 bits, NaN and infinities, lone surrogates, non-string keys, foreign types)."""
    kind = cursor.byte() % 10 if depth < 20 else cursor.byte() % 6
    if kind == 0:
        return None
    if kind == 1:
        return bool(cursor.byte() & 1)
    if kind == 2:
        return int.from_bytes(cursor.take(1 + cursor.byte() % 10), "big", signed=True)
    if kind == 3:
        return struct.unpack(">d", cursor.take(8))[0]
    if kind == 4:
        return cursor.take(cursor.byte() % 16).decode("utf-8", "surrogateescape")
    if kind == 5:
        return cursor.take(cursor.byte() % 16)
    if kind == 9:
        foreign: tuple[Any, ...] = ({b"k": 1}, {1: 2}, {(1,): 2}, {1, 2}, 1j, object(), bytearray(b"x"))
        return foreign[cursor.byte() % len(foreign)]
    children = [_build(cursor, depth + 1) for _ in range(cursor.byte() % 5)]
    if kind == 6:
        return children
    if kind == 7:
        return tuple(children)
    return {cursor.take(cursor.byte() % 4).decode("latin-1"): child for child in children}


def _depth(value: Any) -> int:
    """Nesting depth as the codec counts it: a scalar 0, a container one more than its deepest child."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _wire_legal(value: Any) -> bool:
    """Whether `unpack` must accept `pack(value)` under the default caps (the builder stays far below the
    length caps, so only keys, depth and types decide)."""
    if isinstance(value, dict):
        return all(type(key) is str and _wire_legal(child) for key, child in value.items())
    if isinstance(value, list | tuple):
        return all(_wire_legal(child) for child in value)
    return isinstance(value, (*_PLAIN_TYPES, bytearray))  # pack writes a bytearray as bin


def _check_decoded(value: Any, limits: CodecLimits) -> None:
    """What `unpack` promises about a value it returned, checked node by node."""
    if _depth(value) > limits.max_depth:
        raise AssertionError(f"unpack returned nesting depth {_depth(value)} over the cap {limits.max_depth}")
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            if len(node) > limits.max_map_len:
                raise AssertionError(f"unpack returned a map of {len(node)} entries over the cap")
            for key in node:
                if type(key) is not str:
                    raise AssertionError(f"unpack returned a {type(key).__name__} map key {key!r}")
            stack.extend(node.values())
        elif type(node) is tuple:
            if len(node) > limits.max_array_len:
                raise AssertionError(f"unpack returned an array of {len(node)} items over the cap")
            stack.extend(node)
        elif type(node) is str:
            if len(node.encode()) > limits.max_str_len:
                raise AssertionError(f"unpack returned a str of {len(node.encode())} bytes over the cap")
        elif type(node) is bytes:
            if len(node) > limits.max_bin_len:
                raise AssertionError(f"unpack returned {len(node)} bin bytes over the cap")
        elif type(node) is int:
            if not -(2**63) <= node < 2**64:
                raise AssertionError(f"unpack returned {node}, outside msgpack's ints")
        elif type(node) not in _PLAIN_TYPES:
            raise AssertionError(f"unpack returned a {type(node).__name__}: {node!r}")


def _check_unpack(data: bytes, limits: CodecLimits) -> None:
    try:
        value = unpack(data, limits)
    except DecodeError:
        return
    if len(data) > limits.max_frame_bytes:
        raise AssertionError(f"unpack accepted {len(data)} bytes over the cap {limits.max_frame_bytes}")
    _check_decoded(value, limits)
    try:
        packed = pack(value)
    except EncodeError as exc:
        raise AssertionError(f"unpack returned {value!r}, which pack refuses") from exc
    # Floats read as float32 re-pack as float64, so the cap on the whole message is lifted for the re-read.
    again = unpack(packed, dataclasses.replace(limits, max_frame_bytes=MAX_FRAME_BYTES))
    if pack(again) != packed:
        raise AssertionError(f"{value!r} does not survive pack and unpack")


def _check_pack(cursor: _Cursor) -> None:
    value = _build(cursor)
    try:
        packed = pack(value)
    except EncodeError:
        return
    legal = _wire_legal(value) and _depth(value) <= DEFAULT_LIMITS.max_depth
    try:
        decoded = unpack(packed)
    except DecodeError as exc:
        if legal:
            raise AssertionError(f"unpack refuses the packed form of the wire-legal {value!r}") from exc
        return
    if not legal:
        raise AssertionError(f"unpack accepted the packed form of {value!r}, which is not wire-legal")
    if pack(decoded) != packed:
        raise AssertionError(f"{value!r} does not survive pack and unpack")


def _check_helpers(data: bytes, limits: CodecLimits) -> None:
    with contextlib.suppress(DecodeError):
        text = data.decode("latin-1")
        if uint256_to_decimal(uint256_from_decimal(text)) != text:
            raise AssertionError(f"{text!r} is accepted but is not the canonical decimal of its value")
    with contextlib.suppress(DecodeError):
        if uint256_to_bytes(uint256_from_bytes(data[:32])) != data[:32]:
            raise AssertionError(f"{data[:32]!r} does not round-trip as a uint256")
    header = None
    with contextlib.suppress(DecodeError):
        header = parse_frame_header(data, limits.max_frame_bytes)
    if header is not None:
        length, header_length = header
        if length > limits.max_frame_bytes or veritrain.codec._uvarint(length) != data[:header_length]:
            raise AssertionError(f"frame header {data[:header_length]!r} accepted as length {length}")
    with contextlib.suppress(DecodeError):
        if encode_frame(decode_frame(data, limits.max_frame_bytes), limits.max_frame_bytes) != data:
            raise AssertionError(f"frame {data[:16]!r}... is accepted but does not re-encode to itself")


def check_codec_input(data: bytes) -> None:
    """The codec fuzz oracle (module docstring); raises anything but DecodeError on a finding."""
    if len(data) < 2:
        return
    limits = _CODEC_LIMITS[data[1] % len(_CODEC_LIMITS)]
    mode = data[0] % 3
    if mode == 0:
        _check_unpack(data[2:], limits)
    elif mode == 1:
        _check_pack(_Cursor(data[2:]))
    else:
        _check_helpers(data[2:], limits)


def codec_seed_inputs() -> list[bytes]:
    """A message-like map and a nested array to unpack, a few values to build, a uint256 and a frame."""
    message = pack({"status": "ok", "size": 123, "ratio": 0.5, "parts": [[1, -2], []], "data": b"\x00" * 4})
    return [
        b"\x00\x00" + message,
        b"\x00\x02" + pack([[1, "ab"], {"k": None}]),
        b"\x01\x00" + bytes([8, 3, 4, 1, 0x61, 6, 2, 2, 5, 3, 0x61, 0x62, 0x63]),
        b"\x01\x00" + bytes([7, 4, 0, 1, 1, 3]) + struct.pack(">d", math.nan) + bytes([9, 1]),
        b"\x02\x00" + str(2**200 + 7).encode(),
        b"\x02\x01" + encode_frame(message),
    ]


@dataclasses.dataclass(frozen=True)
class _Target:
    """One fuzz target: its oracle, its seeds, and `prepare`, which loads what the oracle needs before
    fuzzing starts and names the modules whose code gives coverage feedback."""

    check: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    prepare: Callable[[], list[ModuleType]]


def _prepare_decoder() -> list[ModuleType]:
    import veritrain.p2p.messages

    _targets_cached()
    return [veritrain.codec, veritrain.p2p.messages, sys.modules[__name__]]


TARGETS = {
    "decoder": _Target(check_input, seed_inputs, _prepare_decoder),
    "codec": _Target(check_codec_input, codec_seed_inputs, lambda: [veritrain.codec, sys.modules[__name__]]),
}


def msgpack_tokens() -> list[bytes]:
    """libFuzzer dictionary: every msgpack type byte, each length-prefixed one with boundary lengths
    (0, 1, all ones). Mutating blindly inside the uninstrumented msgpack C code, the fuzzer rarely
    writes a marker and a matching length by chance (10^6 runs never made an empty ext8 without these)."""
    tokens = [bytes([marker]) for marker in range(0xC0, 0xE0)]
    for markers, width in ((b"\xc4\xc7\xd9", 1), (b"\xc5\xc8\xda\xdc\xde", 2), (b"\xc6\xc9\xdb\xdd\xdf", 4)):
        for marker in markers:
            tokens += [bytes([marker]) + length for length in (bytes(width), b"\x01".rjust(width, b"\x00"))]
            tokens.append(bytes([marker]) + b"\xff" * width)
    return tokens


def _libfuzzer_escape(token: bytes) -> str:
    return "".join(f"\\x{byte:02x}" for byte in token)


class FuzzReport(BaseModel):
    """What one soak run did; `crashes` counts saved crash/timeout/oom inputs and a failed exit;
    `peak_rss_mib` is the fuzzing process's own peak (0 if it died before reporting it)."""

    target: str
    executions: int
    crashes: int
    peak_rss_mib: float
    wall_s: float
    exit_code: int
    seed: int
    rss_limit_mb: int


def soak(
    runs: int, *, target: str = "decoder", rss_limit_mb: int = 256, seed: int = 1, timeout_s: float = 3600.0
) -> FuzzReport:
    """Fuzz `runs` inputs of `target` (a key of TARGETS) in a child process; its stderr goes to ours,
    findings stay in a temp folder."""
    with tempfile.TemporaryDirectory(prefix="veritrain-fuzz-") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        dictionary = Path(tmp) / "msgpack.dict"
        dictionary.write_text("".join(f'"{_libfuzzer_escape(token)}"\n' for token in msgpack_tokens()))
        for index, data in enumerate(TARGETS[target].seeds()):
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
            target,
            f"-atheris_runs={runs}",
            f"-rss_limit_mb={rss_limit_mb}",
            f"-seed={seed}",
            "-max_len=8192",
            "-timeout=10",
            "-print_final_stats=1",
            f"-dict={dictionary}",
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
        target=target,
        executions=executions,
        crashes=crashes,
        peak_rss_mib=round(int(peak[-1]) / 1024, 1) if peak else 0.0,
        wall_s=round(wall_s, 1),
        exit_code=result.returncode,
        seed=seed,
        rss_limit_mb=rss_limit_mb,
    )


def _target(name: str, argv: list[str]) -> None:
    import atheris

    target = TARGETS[name]
    # Coverage feedback from our own code only (msgpack and pydantic-core are compiled, and
    # instrumenting every loaded module costs minutes at start-up).
    for module in target.prepare():
        for value in list(vars(module).values()):
            functions = vars(value).values() if isinstance(value, type) else [value]
            for function in functions:
                if inspect.isfunction(function) and function.__module__ == module.__name__:
                    atheris.instrument_func(function)
    atexit.register(_at_exit)
    atheris.Setup([sys.argv[0], *argv], target.check)
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
        _target(args[1], args[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m veritrain.p2p.fuzz")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("soak", help="fuzz a target in a child process and report")
    run.add_argument("--target", choices=sorted(TARGETS), default="decoder")
    run.add_argument("--runs", type=int, default=1_000_000)
    run.add_argument("--rss-limit-mb", type=int, default=256)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--json", help="also write the report to this file")
    parsed = parser.parse_args(args)
    report = soak(parsed.runs, target=parsed.target, rss_limit_mb=parsed.rss_limit_mb, seed=parsed.seed)
    text = report.model_dump_json(indent=2)
    print(text)
    if parsed.json:
        Path(parsed.json).write_text(text + "\n")
    return 0 if report.crashes == 0 and report.executions >= parsed.runs else 1


if __name__ == "__main__":
    sys.exit(main())
