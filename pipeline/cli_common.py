"""What every `clariedge` subcommand module shares: the one-line error exit and the common options."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from clariedge.config import ConfigError

ParamsOpt = Annotated[Path, typer.Option("--params", help="params file (one section per stage)")]
StatsOpt = Annotated[Path | None, typer.Option(help="stats JSON (a DVC metric)")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar")]


def fail(message: str, code: int = 1) -> None:
    """Print a one-line error (no traceback) and exit."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


EXPECTED = (ConfigError, FileNotFoundError, ValueError)  # what a stage raises on bad input: one line, no traceback


@contextmanager
def stage_errors(*errors: type[Exception]) -> Iterator[None]:
    """`fail` on the errors a command expects: `errors`, or by default a bad config, a missing file or a bad value."""
    caught = errors or EXPECTED
    try:
        yield
    except caught as err:
        fail(str(err))
