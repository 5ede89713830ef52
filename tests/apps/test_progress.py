"""The one progress helper: a bar on a terminal, plain lines (or nothing) elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from veritrain.progress import progress_bar


def test_off_a_terminal_updates_become_plain_lines_or_nothing() -> None:
    lines: list[str] = []
    pipe = Console(file=io.StringIO(), force_terminal=False)
    with progress_bar("seeds", 3, plain=lines.append, console=pipe) as update:
        update(1)
        update(2, loss=2.5)
    assert lines == ["seeds: 1/3", "seeds: 2/3 loss 2.5000"]
    with progress_bar("quiet", 3, console=pipe) as update:
        update(3)
    assert pipe.file.getvalue() == ""  # type: ignore[attr-defined]


def test_on_a_terminal_a_bar_shows_the_count_and_fields() -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    lines: list[str] = []
    with progress_bar("unit 7", 40, plain=lines.append, console=terminal) as update:
        update(40, loss=1.25)
    shown = screen.getvalue()
    assert "unit 7" in shown and "40/40" in shown and "loss 1.2500" in shown
    assert lines == []  # the bar replaces the plain lines
