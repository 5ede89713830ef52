"""The decoder and codec fuzzers (SECURITY.md D1): short atheris runs in CI, and their oracles shown able
to fail.

The long runs (10^6 executions each) are in `scripts/soak`; their last figures are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import msgpack
import pytest

import veritrain.p2p.fuzz as fuzz
from veritrain import codec
from veritrain.errors import DecodeError


def test_short_fuzz_run_finds_nothing_within_the_memory_cap() -> None:
    report = fuzz.soak(50_000, rss_limit_mb=256, seed=1, timeout_s=300)
    assert report.exit_code == 0 and report.crashes == 0, report
    assert report.executions == 50_000, report
    assert 0 < report.peak_rss_mib < 256, report


def test_the_cap_counts_the_fuzzer_alone_not_its_parent() -> None:
    """Linux carries a process's peak RSS across fork and exec: run from a big test process, the
    fuzzer used to start over its 256 MiB cap and die at once (seen in the full suite after torch)."""
    ballast = b"\x01" * (320 << 20)
    report = fuzz.soak(5_000, rss_limit_mb=256, seed=2, timeout_s=300)
    del ballast
    assert report.exit_code == 0 and report.crashes == 0 and report.executions == 5_000, report


def test_oracle_accepts_every_seed() -> None:
    seeds = fuzz.seed_inputs()
    assert len(seeds) == len(fuzz._targets())
    for data in seeds:
        fuzz.check_input(data)
        fuzz.check_input(data[:-1])  # cut short: refused by both decoders alike
        fuzz.check_input(data + b"\x00")  # a second frame begins: only the streaming reader decodes


def test_oracle_reports_decoders_that_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fuzz.seed_inputs()[1]

    def refuses_everything(*args: object) -> None:
        raise DecodeError("mutant")

    monkeypatch.setattr(fuzz, "decode_message_frame", refuses_everything)
    with pytest.raises(AssertionError, match="one-shot decoder refused"):
        fuzz.check_input(seed)


def test_oracle_reports_a_decoder_that_leaks_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def crashes(*args: object) -> None:
        raise ValueError("mutant")

    monkeypatch.setattr(fuzz, "decode_message_frame", crashes)
    with pytest.raises(ValueError, match="mutant"):
        fuzz.check_input(fuzz.seed_inputs()[0])


def test_oracle_reports_a_lossy_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "encode", lambda model: b"\xc1")
    with pytest.raises(AssertionError, match="re-encodes"):
        fuzz.check_input(fuzz.seed_inputs()[2])


def test_short_codec_fuzz_run_finds_nothing_within_the_memory_cap() -> None:
    report = fuzz.soak(50_000, target="codec", rss_limit_mb=256, seed=1, timeout_s=300)
    assert report.exit_code == 0 and report.crashes == 0, report
    assert report.executions == 50_000 and report.target == "codec", report
    assert 0 < report.peak_rss_mib < 256, report


def test_codec_oracle_accepts_every_seed() -> None:
    for data in fuzz.codec_seed_inputs():
        fuzz.check_codec_input(data)
        fuzz.check_codec_input(data[:-1])


def test_codec_oracle_reports_an_ext_type_let_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_refuse_ext", msgpack.ExtType)
    with pytest.raises(AssertionError, match="ExtType"):
        fuzz.check_codec_input(b"\x00\x00\xc7\x00\x05")


def test_codec_oracle_reports_a_refused_legal_value(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuses_floats(data: bytes, limits: codec.CodecLimits = codec.DEFAULT_LIMITS) -> object:
        if b"\xcb" in data:
            raise DecodeError("mutant")
        return msgpack.unpackb(data, use_list=False)

    monkeypatch.setattr(fuzz, "unpack", refuses_floats)
    with pytest.raises(AssertionError, match="refuses the packed form"):
        fuzz.check_codec_input(b"\x01\x00\x03" + bytes(8))


def test_codec_oracle_reports_a_non_canonical_decimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "uint256_from_decimal", int)
    with pytest.raises(AssertionError, match="canonical decimal"):
        fuzz.check_codec_input(b"\x02\x00007")
