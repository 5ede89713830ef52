"""Applications on top of the roles: the `veritrain` command dispatcher, the demo and the commands that
start or measure several roles together.

Layers: ``veritrain`` (kernel) ← ``market``, ``node``, ``verifier`` (roles) ← ``apps``. Nothing below
imports this package (import-linter contracts in pyproject.toml, run by scripts/test).
"""
