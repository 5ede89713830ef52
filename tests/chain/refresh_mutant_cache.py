"""Compile every variant of the seeded-mutant check and rewrite tests/chain/mutants/compiled (the cache of
tests/chain/mutant_cache.py): an entry for each, and none that no variant uses. Run through
scripts/refresh-mutant-cache after changing a contract, a mutant or the compiler settings, and commit the
result; the check passes without it, only compiling what the cache misses."""

from __future__ import annotations

import json
import sys
import time

from tests.chain import mutant_cache
from tests.chain.invariants_harness import CONTRACT_NAMES, compile_variants


def main() -> int:
    mutant_ids = [mutant["id"] for mutant in json.loads(mutant_cache.MUTANTS_FILE.read_text())["mutants"]]
    variants = [mutant_cache.ORIGINAL, *mutant_ids]
    keys = mutant_cache.variant_keys(variants, CONTRACT_NAMES)
    started = time.monotonic()
    compiled = compile_variants([None, *mutant_ids], processes=2, cached=False)
    elapsed = time.monotonic() - started
    if mutant_cache.variant_keys(variants, CONTRACT_NAMES) != keys:
        print("the sources changed while compiling: nothing written, run it again", file=sys.stderr)
        return 1
    by_variant = {mutant_cache.ORIGINAL if m is None else m: contracts for m, contracts in compiled.items()}
    written, removed = mutant_cache.write(by_variant, CONTRACT_NAMES, keys=keys)
    size = sum((mutant_cache.CACHE_DIR / name).stat().st_size for name in written)
    print(
        f"compiled {len(variants)} variants in {elapsed:.0f} s; {mutant_cache.CACHE_DIR} holds "
        f"{len(written)} entries ({size / 1024:.0f} KiB), {len(removed)} stale ones removed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
