"""The decoder fuzzer (SECURITY.md D1): a short atheris run in CI, and its oracle shown able to fail.

The long run (10^6 executions) is `scripts/soak-decoder`; its last figure is in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import pytest

import veritrain.p2p.fuzz as fuzz
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
