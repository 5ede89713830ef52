"""The wire codec: msgpack with hard size caps, decoded strictly into frozen pydantic models.

Every byte another party sends passes through here, so the rules are narrow on purpose:

- a frame is an unsigned LEB128 length prefix plus that many payload bytes; the declared length is
  checked against the cap *before* a single payload byte is read or allocated (a peer declaring
  2^64 - 1 bytes costs us at most the 10 header bytes);
- msgpack is unpacked with explicit per-type length limits, no ext types, string map keys only,
  no duplicate keys, and a nesting-depth cap;
- the result is validated into a model with ``strict=True`` and ``extra="forbid"``;
- whatever goes wrong, the caller sees exactly one exception type, `DecodeError`.

uint256 values (money, token ids) travel as 32-byte big-endian bytes (`Uint256` fields) or as
canonical decimal strings (`uint256_to_decimal`); never as floats, never as msgpack ints (64 bits).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar, get_args, get_origin

import msgpack
from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, ValidationError
from pydantic_core import core_schema

from veritrain.errors import DecodeError, EncodeError

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_FRAME_BYTES",
    "UINT256_MAX",
    "ByteSource",
    "CodecLimits",
    "DecodeError",
    "EncodeError",
    "FrameReader",
    "Uint256",
    "WireModel",
    "decode",
    "decode_frame",
    "decode_message_frame",
    "encode",
    "encode_frame",
    "encode_message_frame",
    "pack",
    "parse_frame_header",
    "uint256_from_bytes",
    "uint256_from_decimal",
    "uint256_to_bytes",
    "uint256_to_decimal",
    "unpack",
    "write_frame",
]

MAX_FRAME_BYTES = 1 << 20
"""Default frame cap (1 MiB): big enough for one blob chunk, small enough that a hostile peer costs little."""

MAX_VARINT_BYTES = 10
"""An unsigned LEB128 of a 64-bit value needs at most 10 bytes; more is malformed."""

UINT256_MAX = (1 << 256) - 1
_UINT256_MAX_DIGITS = len(str(UINT256_MAX))

WIRE_CONTEXT_KEY = "veritrain_wire"
"""Validation/serialization context flag: set while decoding/encoding wire bytes, so types like
`Uint256` accept only their wire form there and plain Python values elsewhere."""


@dataclass(frozen=True)
class CodecLimits:
    """Caps applied to untrusted input; each one bounds the memory or CPU a peer can make us spend."""

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_depth: int = 16
    max_str_len: int = MAX_FRAME_BYTES
    max_bin_len: int = MAX_FRAME_BYTES
    max_array_len: int = 100_000
    max_map_len: int = 10_000

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"CodecLimits.{name} must be >= 1")


DEFAULT_LIMITS = CodecLimits()


def _mentions_list(annotation: Any) -> bool:
    if annotation is list or get_origin(annotation) is list:
        return True
    return any(_mentions_list(arg) for arg in get_args(annotation))


class WireModel(BaseModel):
    """Base for every message on the wire: immutable, strict types, unknown fields rejected.

    msgpack arrays decode to tuples and strict validation does not turn a tuple into a list, so
    sequence fields must be ``tuple[...]``; a ``list`` field is refused when the class is defined
    rather than failing on the first message.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name, field in cls.model_fields.items():
            if _mentions_list(field.annotation):
                raise TypeError(f"{cls.__name__}.{name}: wire models use tuple[...] for sequences, not list")


M = TypeVar("M", bound=BaseModel)


# --- uint256 -------------------------------------------------------------------------------------


def _check_uint256(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodeError(f"uint256 must be an int, got {type(value).__name__}")
    if not 0 <= value <= UINT256_MAX:
        raise EncodeError("uint256 out of range [0, 2^256 - 1]")
    return value


def uint256_to_bytes(value: int) -> bytes:
    """32-byte big-endian form of a uint256 (the wire form of `Uint256` fields)."""
    return _check_uint256(value).to_bytes(32, "big")


def uint256_from_bytes(data: bytes) -> int:
    """Inverse of `uint256_to_bytes`; anything but exactly 32 bytes is a `DecodeError`."""
    if not isinstance(data, bytes | bytearray) or len(data) != 32:
        raise DecodeError("uint256 must be exactly 32 bytes (big-endian)")
    return int.from_bytes(data, "big")


def uint256_to_decimal(value: int) -> str:
    """Canonical decimal string of a uint256 (for JSON, where numbers above 2^53 are unsafe)."""
    return str(_check_uint256(value))


def uint256_from_decimal(text: str) -> int:
    """Parse a canonical decimal uint256: ASCII digits only, no sign, no leading zeros, < 2^256."""
    if not isinstance(text, str) or not text or len(text) > _UINT256_MAX_DIGITS:
        raise DecodeError("uint256 decimal must be 1-78 ASCII digits")
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise DecodeError("uint256 decimal must be ASCII digits without sign or leading zeros")
    value = int(text)
    if value > UINT256_MAX:
        raise DecodeError("uint256 decimal exceeds 2^256 - 1")
    return value


def _is_wire(info: core_schema.ValidationInfo | core_schema.SerializationInfo) -> bool:
    context = info.context
    return isinstance(context, dict) and bool(context.get(WIRE_CONTEXT_KEY))


def _validate_uint256(value: Any, info: core_schema.ValidationInfo) -> int:
    # On the wire only the 32-byte form is valid; in Python code and JSON, an int or a decimal string.
    try:
        if _is_wire(info):
            return uint256_from_bytes(value)
        if isinstance(value, str):
            return uint256_from_decimal(value)
        return _check_uint256(value)
    except (DecodeError, EncodeError) as exc:
        raise ValueError(str(exc)) from None


def _serialize_uint256(value: int, info: core_schema.SerializationInfo) -> bytes | int | str:
    if _is_wire(info):
        return uint256_to_bytes(value)
    if info.mode == "json":
        return uint256_to_decimal(value)
    return value


Uint256 = Annotated[
    int,
    PlainValidator(_validate_uint256, json_schema_input_type=str),
    PlainSerializer(_serialize_uint256),
]
"""An int in [0, 2^256 - 1]; 32 big-endian bytes on the wire, a decimal string in JSON."""


# --- msgpack values --------------------------------------------------------------------------------


def _reject_unknown_type(value: Any) -> Any:
    if isinstance(value, int):
        raise EncodeError("int outside msgpack's 64-bit range (use a Uint256 field)")
    raise EncodeError(f"cannot put {type(value).__name__} on the wire")


def pack(obj: Any) -> bytes:
    """msgpack-encode plain values (dict/list/tuple/str/bytes/int/float/bool/None)."""
    try:
        return msgpack.packb(obj, use_bin_type=True, default=_reject_unknown_type)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot msgpack-encode value: {exc}") from exc


def _pairs_to_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # msgpack's strict_map_key still admits bytes keys, and a b"k" key beside a "k" key would be a second
    # reading of one field.
    if any(type(key) is not str for key, _ in pairs):
        raise DecodeError("map key is not a string")
    # msgpack silently keeps the last of duplicate keys; two readings of one message are not acceptable.
    result = dict(pairs)
    if len(result) != len(pairs):
        raise DecodeError("duplicate map key")
    return result


def _refuse_ext(code: int, data: bytes) -> Any:
    # max_ext_len=0 still admits an ext of length 0, which msgpack returns as ExtType: a tuple subclass
    # that a tuple[int, bytes] field would accept and that re-encodes as an array.
    raise DecodeError(f"ext type {code} on the wire")


def _nesting_depth(root: Any, max_depth: int) -> None:
    """Raise DecodeError when containers nest deeper than max_depth (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, tuple | list):
            children = value
        else:
            continue
        if depth + 1 > max_depth:
            raise DecodeError(f"nesting deeper than {max_depth}")
        stack.extend((child, depth + 1) for child in children)


def unpack(data: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Any:
    """msgpack-decode one complete value from untrusted bytes under `limits` (arrays become tuples)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_frame_bytes:
        raise DecodeError(f"message of {len(data)} bytes exceeds cap {limits.max_frame_bytes}")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=True,
            object_pairs_hook=_pairs_to_dict,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
            ext_hook=_refuse_ext,
        )
    except DecodeError:
        raise
    except (ValueError, msgpack.UnpackException) as exc:
        # ExtraData, FormatError, StackError, BufferFull, OutOfData are all UnpackException/ValueError.
        raise DecodeError(f"malformed msgpack: {type(exc).__name__}: {exc}") from exc
    _nesting_depth(value, limits.max_depth)
    return value


def encode(model: BaseModel) -> bytes:
    """Wire bytes of a model (its fields as a msgpack map; `Uint256` fields as 32 bytes)."""
    return pack(model.model_dump(mode="python", context={WIRE_CONTEXT_KEY: True}))


def decode(data: bytes, model_type: type[M], limits: CodecLimits = DEFAULT_LIMITS) -> M:
    """Strictly decode untrusted wire bytes into `model_type`; every failure is a `DecodeError`."""
    value = unpack(data, limits)
    if not isinstance(value, dict):
        raise DecodeError(f"{model_type.__name__}: expected a msgpack map, got {type(value).__name__}")
    try:
        return model_type.model_validate(value, strict=True, context={WIRE_CONTEXT_KEY: True})
    except ValidationError as exc:
        raise DecodeError(f"{model_type.__name__}: {exc.error_count()} invalid field(s): {exc}") from exc


# --- frames -----------------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def parse_frame_header(
    buffer: bytes | bytearray | memoryview, max_frame_bytes: int
) -> tuple[int, int] | None:
    """(payload length, header length) of the frame at the start of `buffer`, or None if the header is
    still incomplete. Raises DecodeError as soon as the declared length exceeds the cap, before the
    payload is touched, and for non-minimal or over-long varints."""
    value = 0
    for index in range(min(len(buffer), MAX_VARINT_BYTES)):
        byte = buffer[index]
        value |= (byte & 0x7F) << (7 * index)
        if value > max_frame_bytes:
            raise DecodeError(f"declared frame length exceeds cap {max_frame_bytes}")
        if not byte & 0x80:
            if byte == 0 and index > 0:
                raise DecodeError("non-minimal frame length prefix")
            return value, index + 1
    if len(buffer) >= MAX_VARINT_BYTES:
        raise DecodeError("frame length prefix longer than 10 bytes")
    return None


def encode_frame(payload: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Length-prefix `payload`; refuse to produce a frame the receiver would reject."""
    if len(payload) > max_frame_bytes:
        raise EncodeError(f"payload of {len(payload)} bytes exceeds frame cap {max_frame_bytes}")
    return _uvarint(len(payload)) + payload


def decode_frame(data: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The payload of `data`, which must be exactly one frame."""
    header = parse_frame_header(data, max_frame_bytes)
    if header is None:
        raise DecodeError("incomplete frame length prefix")
    length, header_length = header
    if len(data) != header_length + length:
        raise DecodeError(f"frame declares {length} payload bytes but carries {len(data) - header_length}")
    return bytes(data[header_length:])


def encode_message_frame(model: BaseModel, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One model as one frame."""
    return encode_frame(encode(model), max_frame_bytes)


def decode_message_frame(data: bytes, model_type: type[M], limits: CodecLimits = DEFAULT_LIMITS) -> M:
    """Length prefix -> msgpack -> model, all under `limits`: the whole untrusted-input pipeline."""
    return decode(decode_frame(data, limits.max_frame_bytes), model_type, limits)


class ByteSource(Protocol):
    """Anything with an async `read(n)` returning 1..n bytes, or b"" at end of stream."""

    async def read(self, n: int) -> bytes: ...


class FrameReader:
    """Reads length-prefixed frames from a stream without ever reading past the current frame.

    The header is read byte by byte and checked against the cap as it arrives, so an oversized
    declaration is rejected after at most 10 bytes and nothing is buffered for it.
    """

    def __init__(self, source: ByteSource, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._source = source
        self._max_frame_bytes = max_frame_bytes

    async def _read_some(self, n: int) -> bytes:
        data = await self._source.read(n)
        if not data:
            raise DecodeError("stream ended inside a frame")
        if len(data) > n:
            raise DecodeError("byte source returned more than requested")
        return data

    async def read_frame(self) -> bytes:
        """The next frame's payload; DecodeError on a bad header, an oversized length or early EOF."""
        header = bytearray()
        while True:
            header += await self._read_some(1)
            parsed = parse_frame_header(header, self._max_frame_bytes)
            if parsed is not None:
                break
        length = parsed[0]
        parts: list[bytes] = []
        remaining = length
        while remaining:
            part = await self._read_some(remaining)
            parts.append(part)
            remaining -= len(part)
        return b"".join(parts)

    async def read_message(self, model_type: type[M], limits: CodecLimits = DEFAULT_LIMITS) -> M:
        """The next frame decoded into `model_type`."""
        payload = await self.read_frame()
        return decode(payload, model_type, limits)


async def write_frame(
    write: Callable[[bytes], Awaitable[None]], payload: bytes, max_frame_bytes: int = MAX_FRAME_BYTES
) -> None:
    """Write one frame through an async `write(bytes)`."""
    await write(encode_frame(payload, max_frame_bytes))
