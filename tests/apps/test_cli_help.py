"""`veritrain --help` lists every role's commands: the operator's, the provider's, the verifier's and the
buyer's, as the installed console script prints them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from apps.cli import COMMANDS

VERITRAIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "veritrain"
EVERY_ROLE = {
    "operator": ["chain deploy", "chain fund", "market serve", "market worker", "config show"],
    "provider": ["keys new", "node run"],
    "verifier": ["verifier run"],
    "buyer": ["order post", "order status", "order watch", "order fetch", "order close"],
}


def test_help_lists_every_command_of_every_role() -> None:
    # a narrow terminal must not matter: the CLI prints its help at a fixed width that never wraps a group
    narrow = {**os.environ, "COLUMNS": "60"}
    shown = subprocess.run(
        [str(VERITRAIN), "--help"], capture_output=True, text=True, check=True, env=narrow
    ).stdout
    groups: dict[str, set[str]] = {}
    for line in shown.splitlines():  # a group's line reads "order   order post|status|watch|fetch|close"
        words = line.split()
        if len(words) == 3 and words[0] == words[1]:
            groups[words[0]] = set(words[2].split("|"))
    for role, commands in EVERY_ROLE.items():
        for command in commands:
            group, sub = command.split()
            assert sub in groups.get(group, set()), f"{role}: `veritrain {command}` missing from --help"
    for words, _, _ in COMMANDS:  # and nothing registered is hidden
        if len(words) == 2:
            assert words[1] in groups[words[0]], f"veritrain {' '.join(words)} missing from --help"


def test_readme_keeps_two_set_up_commands_and_links_the_four_guides() -> None:
    readme = (VERITRAIN.parents[2] / "README.md").read_text()
    blocks = readme.split("```bash\n")[1:]
    assert len(blocks) == 1, "the README has one runnable block: the set-up"
    commands = [line.split("#")[0].strip() for line in blocks[0].split("```")[0].splitlines()]
    assert [c for c in commands if c] == ["scripts/demo", "scripts/test"]
    for guide in ("OPERATORS", "PROVIDERS", "VERIFIERS", "BUYERS"):
        assert f"(docs/{guide}.md)" in readme
