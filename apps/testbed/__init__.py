"""Test beds for running Veritrain across hosts on one machine (network namespaces); a library, so the
multi-host test and issue 11's chaos suite share it."""
