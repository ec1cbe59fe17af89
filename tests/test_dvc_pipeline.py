"""The DVC pipeline definition is consistent with the code: every stage calls a real `clariedge`
subcommand, every dependency file exists, every params key it declares exists in params.yaml, every
file of the code the stage runs is among its deps (a code change reruns it), and every file it writes
or reads is declared."""

from __future__ import annotations

import ast
import inspect
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from clariedge.cli import app

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def _expanded_stages() -> list[tuple[str, dict]]:
    """Stages with `foreach`/`matrix` expanded enough to check their commands and deps."""
    out = []
    for name, stage in DVC["stages"].items():
        over = stage.get("foreach")
        if isinstance(over, str) and over.startswith("${") and over.endswith("}"):
            node = PARAMS  # `foreach: ${a.b}` over a params mapping or list: one stage per key / item
            for part in over[2:-1].split("."):
                node = node[part]
            keys = list(node) if isinstance(node, dict) else [str(v) for v in node]
            for key in keys:
                text = yaml.safe_dump(stage["do"]).replace("${key}", key).replace("${item}", key)
                out.append((f"{name}@{key}", yaml.safe_load(text)))
        else:
            out.append((name, stage.get("do", stage)))
    return out


STAGES = _expanded_stages()


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_calls_a_real_subcommand(name: str, stage: dict) -> None:
    words = shlex.split(stage["cmd"].replace("${", "X").replace("}", ""))
    assert words[0] == "clariedge", f"stage {name} must call the clariedge console script"
    group = get_command(app)
    cmd = group
    for w in words[1:]:
        if w.startswith("-") or not hasattr(cmd, "commands"):
            break
        assert w in cmd.commands, f"stage {name}: `{w}` is not a clariedge subcommand"
        cmd = cmd.commands[w]
    assert cmd is not group


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_deps_exist_and_params_are_declared(name: str, stage: dict) -> None:
    for dep in stage.get("deps", []):
        if "${" in dep:
            continue
        produced = any(dep == o or dep.startswith(str(o).rstrip("/") + "/") for _, s in STAGES for o in _outs(s))
        assert produced or (ROOT / dep).exists(), f"stage {name}: dependency {dep} does not exist"
    for p in stage.get("params", []):
        keys = p if isinstance(p, str) else next(iter(p))
        node = PARAMS
        for part in str(keys).split("."):
            if "${" in part:
                break
            assert isinstance(node, dict) and part in node, f"stage {name}: params key {keys} not in params.yaml"
            node = node[part]


def _outs(stage: dict) -> list[str]:
    out = []
    for key in ("outs", "metrics", "plots"):
        for o in stage.get(key, []) or []:
            out.append(o if isinstance(o, str) else next(iter(o)))
    return out


# ---------------------------------------------------------------------------------------------
# Code dependencies: each stage's import closure must be among its DVC deps
# ---------------------------------------------------------------------------------------------
_SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = _SETUPTOOLS["package-dir"]  # clariedge.training -> training, ...
PACKAGE_DATA: dict[str, list[str]] = _SETUPTOOLS.get("package-data", {})  # files read through importlib.resources
# the CLI: `clariedge.cli` and its sibling modules `clariedge.cli_*` (the review group, the shared options)
CLI_MODULES = {f"clariedge.{p.stem}" for p in (ROOT / PACKAGE_DIRS["clariedge"]).glob("cli*.py")}


def module_file(name: str) -> Path | None:
    """`clariedge.x.y` -> its file relative to the root (`<dir>/x/y.py`, or `<dir>/x/y/__init__.py` for a
    package); None for a name outside the project or one that is not a module (an attribute)."""
    for pkg in sorted(PACKAGE_DIRS, key=len, reverse=True):
        if name == pkg or name.startswith(pkg + "."):
            base = Path(PACKAGE_DIRS[pkg], *name[len(pkg) + 1 :].split(".")) if name != pkg else Path(PACKAGE_DIRS[pkg])
            if name != pkg and (ROOT / base.with_suffix(".py")).is_file():
                return base.with_suffix(".py")
            if (ROOT / base / "__init__.py").is_file():
                return base / "__init__.py"
            return None
    return None


def _is_trivial_init(path: Path) -> bool:
    """A package __init__ that runs nothing: a docstring, `from __future__`, constant dunders (`__version__`)."""
    for node in ast.parse((ROOT / path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and all(isinstance(t, ast.Name) and t.id.startswith("__") for t in node.targets)
        ):
            continue
        return False
    return True


def _runtime_nodes(tree: ast.AST):
    """Every node that runs: `if TYPE_CHECKING:` bodies are left out (their else branches kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """First-party modules a piece of code imports (anywhere in it: lazy imports inside functions count)."""
    found: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # a submodule, where the name is one
    return {m for m in found if module_file(m) is not None}


def _resources(tree: ast.AST) -> set[str]:
    """Packages whose data files the code reads by name (`importlib.resources.files("clariedge.annotation")`)."""
    return {
        n.value
        for n in _runtime_nodes(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in PACKAGE_DATA
    }


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a/__init__ and a.b/__init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _cli_function_imports(fn_name: str, seen: set[str] | None = None) -> set[str]:
    """Modules a function of the CLI imports, following its calls to other functions of the CLI modules."""
    seen = seen if seen is not None else set()
    seen.add(fn_name)
    module, tree = _CLI_FUNCTIONS[fn_name]
    out = _imports(tree, module, False)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = node.func.id
            if callee in _CLI_FUNCTIONS and callee not in seen:
                out |= _cli_function_imports(callee, seen)
    return out


_CLI_TREES = {m: ast.parse((ROOT / module_file(m)).read_text(encoding="utf-8")) for m in sorted(CLI_MODULES)}
_CLI_FUNCTIONS = {n.name: (m, n) for m, t in _CLI_TREES.items() for n in t.body if isinstance(n, ast.FunctionDef)}
assert len(_CLI_FUNCTIONS) == sum(isinstance(n, ast.FunctionDef) for t in _CLI_TREES.values() for n in t.body), (
    "a function name is defined in two CLI modules"
)
_CLI_MODULE_IMPORTS = {
    name
    for m, t in _CLI_TREES.items()
    for name in _imports(
        ast.Module(body=[n for n in t.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[]), m, False
    )
}


def stage_command(stage: dict) -> list[str]:
    """The `clariedge` subcommand path a stage's cmd calls, e.g. ['review', 'run']."""
    words = shlex.split(stage["cmd"].replace("${", "X").replace("}", ""))
    cmd, path = get_command(app), []
    for w in words[1:]:
        if w.startswith("-") or not hasattr(cmd, "commands") or w not in cmd.commands:
            break
        cmd = cmd.commands[w]
        path.append(w)
    return path


def code_closure(stage: dict) -> set[str]:
    """Every project file the stage's command runs or reads as package data: the subcommand's function
    (and the CLI helpers it calls), then the transitive closure of the first-party modules they import.
    The CLI modules themselves and package __init__ files that run nothing are left out."""
    group = get_command(app)
    cmd = group
    for w in stage_command(stage):
        cmd = cmd.commands[w]
    fn = inspect.unwrap(cmd.callback)
    todo = {p for m in _cli_function_imports(fn.__name__) | _CLI_MODULE_IMPORTS for p in _with_parents(m)}
    done: set[str] = set()
    data: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done or name in CLI_MODULES:
            continue
        done.add(name)
        path = module_file(name)
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        todo |= {p for m in _imports(tree, name, path.name == "__init__.py") for p in _with_parents(m)} - done
        data |= _resources(tree)
    files: set[str] = set()
    for name in done:
        path = module_file(name)
        if path is None or name in CLI_MODULES:
            continue
        if path.name != "__init__.py" or not _is_trivial_init(path):
            files.add(path.as_posix())
    for pkg in data:  # package data read through importlib.resources (pyproject's package-data globs)
        folder = ROOT / module_file(pkg).parent
        files.update(p.relative_to(ROOT).as_posix() for g in PACKAGE_DATA[pkg] for p in folder.glob(g))
    return files


def covered(path: str, declared: list[str]) -> bool:
    """A declared file covers itself, a declared folder everything under it."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in declared)


def undeclared_code(stage: dict) -> list[str]:
    """Files of the stage's code closure that its `deps` do not cover (each one a stale-output bug)."""
    deps = [str(d) for d in stage.get("deps", [])]
    return sorted(f for f in code_closure(stage) if not covered(f, deps))


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_code_is_among_its_deps(name: str, stage: dict) -> None:
    missing = undeclared_code(stage)
    assert not missing, f"stage {name}: code it runs is not in its deps (a change would not rerun it): {missing}"


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_code_deps_are_used(name: str, stage: dict) -> None:
    """The other way round: a code dep the stage never runs only reruns it for nothing."""
    closure = code_closure(stage)
    code_dirs = tuple(d.rstrip("/") + "/" for d in PACKAGE_DIRS.values())
    unused = [
        d
        for d in map(str, stage.get("deps", []))
        if (d + "/").startswith(code_dirs) and not any(f == d or f.startswith(d.rstrip("/") + "/") for f in closure)
    ]
    assert not unused, f"stage {name}: deps its code never imports or reads: {unused}"


def test_checker_finds_a_planted_missing_dependency() -> None:
    stage = dict(DVC["stages"]["filter"])
    assert undeclared_code(stage) == []
    assert "pipeline/embed.py" in code_closure(stage)
    planted = {**stage, "deps": [d for d in stage["deps"] if d != "pipeline/embed.py"]}
    assert undeclared_code(planted) == ["pipeline/embed.py"]


def test_checker_handles_package_folders_and_package_data() -> None:
    synth = DVC["stages"]["synthesize"]
    closure = code_closure(synth)
    assert "pipeline/construct/__init__.py" in closure  # a package: its __init__ and every submodule it imports
    assert {"pipeline/construct/build.py", "pipeline/construct/text.py"} <= closure
    assert "generation_prompts/clarification.v1.yaml" in closure  # read through importlib.resources
    assert "pipeline/__init__.py" not in closure  # runs nothing
    assert not {"pipeline/cli.py", "pipeline/cli_common.py", "pipeline/cli_review.py"} & closure
    no_folder = {**synth, "deps": [d for d in synth["deps"] if d != "pipeline/construct"]}
    assert "pipeline/construct/core.py" in undeclared_code(no_folder)


# ---------------------------------------------------------------------------------------------
# Files: every path a stage reads or writes, on its command line or in its params, is declared
# ---------------------------------------------------------------------------------------------
PROJECT_DIRS = ("data", "cache", "models", "metrics", "reports", "plots")

# Paths in params that a stage touches only when a setting other than `enabled` selects them; each must
# be declared (a dep it reads, an out it writes) in a run where that setting is on.
USED_ONLY_WHEN = {
    "ingest.mtrag_url.cache_dir": lambda p: p["ingest"]["source"] == "mtrag_url",
    "review.import_path": lambda p: p["review"]["mode"] == "import",
}


def _is_project_path(value: object) -> bool:
    return isinstance(value, str) and " " not in value and value.split("/")[0] in PROJECT_DIRS


def _declared(stage: dict) -> list[str]:
    return [str(d) for d in stage.get("deps", [])] + _outs(stage)


def cmd_paths(stage: dict) -> list[str]:
    """Project paths on the stage's command line (arguments and option values)."""
    return [w for w in shlex.split(stage["cmd"])[1:] if _is_project_path(w)]


def params_paths(stage: dict, params: dict) -> dict[str, str]:
    """`key -> path` for project paths in the params the stage declares, leaving out blocks that are
    switched off (`enabled: false`) and keys whose feature is not selected (`USED_ONLY_WHEN`)."""
    found: dict[str, str] = {}

    def walk(key: str, node: object) -> None:
        if key in USED_ONLY_WHEN and not USED_ONLY_WHEN[key](params):
            return
        if isinstance(node, dict):
            if node.get("enabled") is False:
                return
            for k, v in node.items():
                walk(f"{key}.{k}", v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(f"{key}[{i}]", v)
        elif _is_project_path(node):
            found[key] = node

    for entry in stage.get("params", []):
        key = entry if isinstance(entry, str) else next(iter(entry))
        node = params
        for part in str(key).split("."):
            node = node[part]
        walk(str(key), node)
    return found


def undeclared_files(stage: dict, params: dict = PARAMS) -> list[str]:
    """Paths the stage reads or writes (command line, params) that none of its deps/outs/metrics/plots
    declare. A folder argument counts as declared when what is declared lies inside it."""
    declared = _declared(stage)
    problems = []
    used = [("cmd", p) for p in cmd_paths(stage)] + list(params_paths(stage, params).items())
    for where, path in used:
        inside = any(d.startswith(path.rstrip("/") + "/") for d in declared)
        if not (covered(path, declared) or inside):
            problems.append(f"{path} ({where})")
    return sorted(problems)


def test_no_file_has_two_writers() -> None:
    """DVC allows one stage per output: two stages writing one file (a shared cache) is an undeclared write."""
    writers: dict[str, list[str]] = {}
    for name, stage in STAGES:
        for out in _outs(stage):
            writers.setdefault(out, []).append(name)
    assert {o: w for o, w in writers.items() if len(w) > 1} == {}


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_files_are_declared(name: str, stage: dict) -> None:
    missing = undeclared_files(stage)
    assert not missing, f"stage {name}: reads or writes undeclared files: {missing}"


def test_file_checker_finds_a_planted_undeclared_cache() -> None:
    stage = DVC["stages"]["filter"]
    assert undeclared_files(stage) == []
    cache = PARAMS["filter"]["dedup"]["cache"]
    planted = {**stage, "outs": [o for o in stage["outs"] if (o if isinstance(o, str) else next(iter(o))) != cache]}
    assert undeclared_files(planted) == [f"{cache} (filter.dedup.cache)"]
    switched_off = {**PARAMS, "filter": {**PARAMS["filter"], "dedup": {**PARAMS["filter"]["dedup"], "enabled": False}}}
    assert undeclared_files(planted, switched_off) == []
