"""The `clariedge` console script: one subcommand per pipeline stage.

This is the only module that reads argv, environment variables and `params.yaml`; it hands each
stage its validated config section. Heavy libraries are imported inside the commands, so
`clariedge --help` stays fast.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from clariedge import __version__
from clariedge.config import ConfigError, load_section

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])

ParamsOpt = Annotated[Path, typer.Option("--params", help="params file (one section per stage)")]


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


def fail(message: str, code: int = 1) -> None:
    """Print a one-line error (no traceback) and exit."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
    version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False,
) -> None:
    """clariedge: query-clarification data pipeline and model."""
    if version:
        typer.echo(__version__)
        raise typer.Exit()
    setup_logging(verbose)


@app.command()
def ingest(
    paths: Annotated[list[Path] | None, typer.Argument(help="files or folders; default: params ingest.paths")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="seed turns parquet")] = Path("data/seeds.parquet"),
    rejects: Annotated[Path | None, typer.Option(help="rejected rows JSONL")] = None,
    stats: Annotated[Path | None, typer.Option(help="stats JSON (a DVC metric)")] = None,
    strict: Annotated[bool | None, typer.Option("--strict/--no-strict", help="exit non-zero on any bad row")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Read grounded dialogs (MTRAG task JSONL / bundle JSON / BEIR files / project JSONL) into seed turns."""
    from clariedge import ingest as stage
    from clariedge.download import DownloadError, fetch

    try:
        cfg = load_section(params, "ingest", stage.IngestConfig) if params.exists() else stage.IngestConfig()
        if paths:
            sources: list[str | Path] = list(paths)
        elif cfg.source == "mtrag_url":
            if cfg.mtrag_url is None:
                raise ConfigError(f"{params}: ingest.mtrag_url is required when ingest.source is mtrag_url")
            u = cfg.mtrag_url
            sources = [fetch(u.base_url, u.files, u.cache_dir, u.timeout_s)]
        elif cfg.source == "sample":
            sources = ["data/sample"]
        else:
            sources = list(cfg.paths)
        stage.run(sources, output, rejects, stats, strict=cfg.strict if strict is None else strict)
    except (ConfigError, DownloadError, stage.IngestError, FileNotFoundError) as err:
        fail(str(err))


@app.command()
def synthesize(
    seeds: Annotated[Path, typer.Argument(help="seed turns parquet (ingest output)")] = Path("data/seeds.parquet"),
    output: Annotated[Path, typer.Option("-o", "--output", help="candidate examples parquet")] = Path(
        "data/candidates.parquet"
    ),
    rejects: Annotated[Path | None, typer.Option(help="rejected jobs JSONL")] = None,
    stats: Annotated[Path | None, typer.Option(help="stats JSON (a DVC metric)")] = None,
    cache: Annotated[Path, typer.Option(help="LLM call cache (SQLite)")] = Path("cache/llm.sqlite"),
    backend: Annotated[
        str | None, typer.Option(help="override synthesize.backend: construct | openai | transformers")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar")] = True,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Synthesize candidate examples of the four categories (construct | openai | transformers backend)."""
    import os

    from clariedge import synthesize as stage
    from clariedge.config import load_params
    from clariedge.llm import LLMConfigError
    from clariedge.prompts import PromptError

    try:
        cfg = (
            load_section(params, "synthesize", stage.SynthesizeConfig) if params.exists() else stage.SynthesizeConfig()
        )
        if backend is not None:
            if backend not in ("construct", "openai", "transformers"):
                raise ConfigError(f"--backend {backend!r}: expected construct, openai or transformers")
            cfg = cfg.model_copy(update={"backend": backend})
        seed = int(load_params(params).get("seed", 0)) if params.exists() else 0
        api_key = os.environ.get(cfg.openai.api_key_env) if cfg.backend == "openai" else None
        stage.run(seeds, output, rejects, stats, cfg, seed=seed, cache_path=cache, api_key=api_key, progress=progress)
    except (ConfigError, FileNotFoundError, LLMConfigError, PromptError, ValueError) as err:
        fail(str(err))


def run() -> None:  # pragma: no cover - console entry point
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    run()
