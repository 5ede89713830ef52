"""One progress display for every long-running command (demo, bench, agents' units), built on rich.

Why one helper: the commands should look and behave alike — a live bar on a terminal, and on a pipe or in a
log file nothing but the plain lines the caller writes anyway (a bar redrawn into a log is noise). The bar
goes to stderr, so a command's results on stdout (`--json`) stay machine-readable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Advance = Callable[..., None]


def stderr_console() -> Console:
    return Console(stderr=True)


@contextmanager
def progress_bar(
    description: str,
    total: int,
    *,
    plain: Callable[[str], None] | None = None,
    console: Console | None = None,
) -> Iterator[Advance]:
    """A bar of `total` steps; yields ``update(completed, **fields)`` (fields such as ``loss=2.3`` are shown
    after the bar). Off a terminal it draws nothing: each update becomes one line through `plain` if given
    (for commands whose output is read in CI logs), else costs nothing."""
    out = console or stderr_console()
    if not out.is_terminal:
        if plain is None:
            yield _ignore
            return

        def line(completed: int, **fields: Any) -> None:
            assert plain is not None
            plain(f"{description}: {completed}/{total} {_info(fields)}".rstrip())

        yield line
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=out, transient=False) as bar:
        task = bar.add_task(description, total=total, info="")

        def update(completed: int, **fields: Any) -> None:
            bar.update(task, completed=completed, info=_info(fields))

        yield update


def _ignore(*_args: Any, **_fields: Any) -> None:
    return None


def _info(fields: dict[str, Any]) -> str:
    return "  ".join(
        f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
        for key, value in fields.items()
    )
