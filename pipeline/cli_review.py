"""The `clariedge review` subcommands (Argilla): the local server (`up`, `down`), `push`, `pull`, `export`
and the DVC stage itself (`run`); `review_config` is also what clean's `send_back` uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clariedge.cli_common import EXPECTED, ParamsOpt, ProgressOpt, StatsOpt, fail, stage_errors
from clariedge.config import ConfigError, load_stage_config

review_app = typer.Typer(no_args_is_help=True, help="Human review in Argilla: local server, push, pull, the stage.")

ARGILLA_DEFAULT_URL = "http://127.0.0.1:6900"


def review_config(params: Path = Path("params.yaml"), mode: str | None = None):  # -> ReviewConfig
    """The `review:` section, with the server URL and key from ARGILLA_API_URL / ARGILLA_API_KEY
    (what other stages, e.g. clean's `send_back`, should use too)."""
    import os

    from clariedge.annotation.review import ReviewConfig

    cfg = load_stage_config(params, "review", ReviewConfig)
    update: dict[str, str] = {
        "api_url": os.environ.get("ARGILLA_API_URL") or ARGILLA_DEFAULT_URL,
        "api_key": os.environ.get("ARGILLA_API_KEY") or "",
    }
    if mode is not None:
        if mode not in ("none", "argilla", "import"):
            raise ConfigError(f"--mode {mode!r}: expected none, argilla or import")
        update["mode"] = mode
    return cfg.model_copy(update=update)


def _argilla_script(action: str, *args: str, cfg=None) -> int:
    import os
    import subprocess

    script = Path("scripts/argilla.sh")
    if not script.exists():
        script = Path(__file__).resolve().parents[1] / "scripts" / "argilla.sh"
    if not script.exists():
        fail("scripts/argilla.sh not found: run from the project checkout")
    env = dict(os.environ)
    if cfg is not None:
        env.setdefault("ARGILLA_OWNER", cfg.owner)
        env.setdefault("ARGILLA_ANNOTATORS", " ".join(cfg.annotators))
        env.setdefault("ARGILLA_WORKSPACE", cfg.workspace)
    return subprocess.call(["bash", str(script), action, *args], env=env)


@review_app.command("up")
def review_up(params: ParamsOpt = Path("params.yaml")) -> None:
    """Install (first time) and start the local Argilla stack; prints the UI URL and credentials."""
    with stage_errors(ConfigError):
        cfg = review_config(params)
    code = _argilla_script("install") or _argilla_script("up", cfg=cfg)
    if code:
        fail("the local Argilla stack did not start (see the lines above and .argilla/logs/)", code)


@review_app.command("down")
def review_down() -> None:
    """Stop exactly the processes `review up` started (safe to repeat)."""
    code = _argilla_script("down")
    if code:
        fail("could not stop the local Argilla stack", code)


@review_app.command("push")
def review_push(
    examples: Annotated[Path, typer.Argument(help="examples parquet")],
    force: Annotated[bool, typer.Option("--force", help="re-send records whose content is unchanged")] = False,
    progress: ProgressOpt = True,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Push examples to the Argilla dataset (ids = example ids: re-pushing updates, never duplicates)."""
    from clariedge.annotation import review as stage
    from clariedge.io import read_records
    from clariedge.schema import Example

    with stage_errors(*EXPECTED, stage.ReviewError):
        cfg = review_config(params, "argilla")
        stats = stage.push(read_records(examples, Example), cfg, force=force, progress=progress)
    refused = stats.pop("refused")
    typer.echo(
        f"{stats['dataset']}: {stats['created']} created, {stats['updated']} updated, "
        f"{stats['skipped_unchanged']} unchanged, {len(refused)} refused"
    )
    for r in refused:
        typer.secho(f"refused {r['id']}: {r['error']}", fg=typer.colors.YELLOW, err=True)


def _review_outputs(
    examples: Path, output: Path, snapshot: Path | None, discarded: Path | None, stats: Path | None, cfg, push: bool
) -> None:
    from clariedge.annotation import review as stage

    with stage_errors(FileNotFoundError, ValueError, stage.ReviewError):
        result = stage.run(
            examples, output, cfg, snapshot_path=snapshot, discarded_path=discarded, stats_path=stats, push_first=push
        )
    typer.echo(
        f"review ({cfg.mode}): {result['rows_out']} rows out: {result['reviewed']} reviewed, "
        f"{result['pending']} pending, {result['unreviewed']} unreviewed; {result['discarded']} discarded"
    )


SnapshotOpt = Annotated[
    Path | None, typer.Option(help="pulled responses JSONL (the snapshot the output is built from)")
]
DiscardedOpt = Annotated[Path | None, typer.Option(help="discarded records parquet (kept apart)")]


@review_app.command("pull")
def review_pull(
    examples: Annotated[Path, typer.Argument(help="the examples that were pushed (parquet)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="reviewed examples parquet")],
    snapshot: SnapshotOpt = None,
    discarded: DiscardedOpt = None,
    stats: StatsOpt = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Pull submitted/discarded responses from the live server and write the reviewed examples."""
    with stage_errors(ConfigError):
        cfg = review_config(params, "argilla")
    _review_outputs(examples, output, snapshot, discarded, stats, cfg, push=False)


@review_app.command("run")
def review_run(
    examples: Annotated[Path, typer.Argument(help="examples parquet (filter output)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="reviewed examples parquet")],
    snapshot: SnapshotOpt = None,
    discarded: DiscardedOpt = None,
    stats: StatsOpt = None,
    mode: Annotated[str | None, typer.Option(help="override review.mode: none | argilla | import")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """The review stage: none = pass-through (unreviewed); argilla = push, then pull; import = read an export."""
    with stage_errors(ConfigError):
        cfg = review_config(params, mode)
    _review_outputs(examples, output, snapshot, discarded, stats, cfg, push=True)


@review_app.command("export")
def review_export(
    folder: Annotated[Path, typer.Argument(help="empty folder for Dataset.to_disk (what mode import reads)")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Export the live dataset to disk (settings + records with responses) for review.mode import."""
    from clariedge.annotation import review as stage

    with stage_errors(ConfigError, stage.ReviewError):
        path = stage.export_dataset(review_config(params, "argilla"), folder)
    typer.echo(f"exported to {path}")
