"""The import rules of docs/architecture.md: no import circle anywhere in the package, and no
layer importing one above it (so no core module reaches the outputs layer or the CLI).

Every import counts, including those inside functions: a lazy import that breaks a circle at
run time is still a circle in the design.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hetsgd

#: Top-level parts of the package, lowest first; a module may import its own layer and below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "machine", "liveness", "atomic", "bounded", "targets",
               "durations", "readback", "lasting_output"}),
    frozenset({"config"}),
    frozenset({"data", "model"}),
    frozenset({"workers"}),
    frozenset({"engines"}),
    frozenset({"algorithms", "observe"}),
    frozenset({"outputs"}),
    frozenset({"runs", "tuning"}),
    frozenset({"train"}),
    frozenset({"invocation"}),
    frozenset({"cli", "completion", "api"}),
    frozenset({"entry", "__main__"}),
)


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (``pkg.a.b``; ``pkg.a`` for
    ``a/__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from a import b`` counts as ``a.b`` where
    that is a module, else ``a``)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                           else node.module for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else module
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
            if "." in a and layer_of(b) > layer_of(a)]


PACKAGE_ROOT = Path(hetsgd.__file__).parent
GRAPH = import_graph(PACKAGE_ROOT, "hetsgd")


def test_every_top_level_part_has_a_layer() -> None:
    parts = {name.split(".")[1] for name in GRAPH if "." in name}
    assert parts <= set().union(*LAYERS), parts - set().union(*LAYERS)


def test_no_import_circle_in_the_package() -> None:
    assert circles(GRAPH) == []


def test_no_layer_imports_one_above_it() -> None:
    assert upward_imports(GRAPH) == []


#: Engine packages that one never imports: ``engines.common`` (shared memory, the worker's loop,
#: the process coordinator) is what every engine builds on, so it imports no engine; the
#: distributed and virtual engines never build on the asynchronous one.
APART = (("hetsgd.engines.common.", "hetsgd.engines.async_shared"),
         ("hetsgd.engines.common.", "hetsgd.engines.ranks"),
         ("hetsgd.engines.common.", "hetsgd.engines.virtual"),
         ("hetsgd.engines.ranks", "hetsgd.engines.async_shared"),
         ("hetsgd.engines.virtual", "hetsgd.engines.async_shared"))


def test_the_engines_build_on_the_shared_package_and_not_on_one_another() -> None:
    assert [f"{a} -> {b}" for a, targets in sorted(GRAPH.items()) for b in sorted(targets)
            for importer, imported in APART
            if f"{a}.".startswith(importer) and b.startswith(imported)] == []


#: The size limits of docs/architecture.md: a module is one concept, a function one step.
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def oversized(root: Path) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions (methods and nested ones
    included) over :data:`MAX_FUNCTION_LINES`, from ``def`` to their last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(root.parent).as_posix()
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_and_no_function_is_over_its_limit() -> None:
    assert oversized(PACKAGE_ROOT) == []


def test_the_size_check_catches_a_long_module_and_a_long_method(tmp_path: Path) -> None:
    """One line over each limit is caught; a function exactly at its limit is not."""
    root = tmp_path / "hetsgd"
    root.mkdir()

    def body(lines: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(lines))

    (root / "long_method.py").write_text("class A:\n    def f(self):\n"
                                         + body(MAX_FUNCTION_LINES, " " * 8))
    (root / "fits.py").write_text("def g():\n" + body(MAX_FUNCTION_LINES - 1, " " * 4))
    (root / "long_module.py").write_text(body(MAX_MODULE_LINES + 1, ""))
    assert oversized(root) == [f"hetsgd/long_method.py:2 f: {MAX_FUNCTION_LINES + 1} lines",
                               f"hetsgd/long_module.py: {MAX_MODULE_LINES + 1} lines"]


REPO = PACKAGE_ROOT.parent
#: A file the docs cite in backticks (`engines/common/links.py`, `config/compose.py: recomposable`,
#: `engines/ranks/loop.py: RankLoop.run`), relative to the repository or the package; a
#: placeholder (`DIR/algo/NAME.yaml`) or a glob is no citation.
CITED = re.compile(r"`((?:[a-z_.]+/)+[a-z_0-9]+\.(?:py|sh|yaml|md))(?::\s*([A-Za-z_][\w.]*))?`")


def defines(path: Path, dotted: str) -> bool:
    """Whether ``path`` defines ``dotted`` (``run``, ``Coordinator.run``, ``LOSS_READ_S``) at its
    top level, a method within its class."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = [node for node in scope if part in _names(node)]
        if not found:
            return False
        scope = getattr(found[0], "body", [])
    return True


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else (
        [node.target] if isinstance(node, ast.AnnAssign) else [])
    return {t.id for t in targets if isinstance(t, ast.Name)}


def wrong_citations(docs: list[Path], repo: Path) -> list[str]:
    """Each cited file that does not exist, and each cited name its file does not define."""
    wrong = []
    for doc in docs:
        for cited, name in CITED.findall(doc.read_text()):
            path = next((p for p in (repo / cited, repo / "hetsgd" / cited) if p.is_file()), None)
            if path is None:
                wrong.append(f"{doc.name}: {cited}")
            elif name and not defines(path, name):
                wrong.append(f"{doc.name}: {cited}: {name}")
    return wrong


def test_every_file_and_name_the_docs_cite_exists() -> None:
    """README.md and docs/*.md (not docs/results/, which record past runs as they were)."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert wrong_citations(docs, REPO) == []


def test_the_citation_check_catches_a_gone_file_and_a_gone_name(tmp_path: Path) -> None:
    (tmp_path / "hetsgd" / "runs").mkdir(parents=True)
    (tmp_path / "hetsgd" / "runs" / "runner.py").write_text("class A:\n    def run(self): ...\n")
    doc = tmp_path / "page.md"
    doc.write_text("`runs/runner.py: A.run`, `runs/runner.py: A.walk`, `hetsgd/runs/gone.py`, "
                   "`runs/runner.py: run`, `DIR/algo/NAME.yaml`")
    assert wrong_citations([doc], tmp_path) == [
        "page.md: runs/runner.py: A.walk", "page.md: hetsgd/runs/gone.py",
        "page.md: runs/runner.py: run"]


@pytest.mark.parametrize("lazy", [False, True])
def test_the_checks_catch_a_deliberate_circle_and_an_upward_import(tmp_path: Path,
                                                                   lazy: bool) -> None:
    """The same checks on a small package with a circle (at module level, or hidden inside a
    function) and a model module that imports the outputs layer."""
    root = tmp_path / "hetsgd"
    (root / "model").mkdir(parents=True)
    (root / "outputs").mkdir()
    (root / "__init__.py").write_text("")
    (root / "model" / "__init__.py").write_text("")
    (root / "outputs" / "__init__.py").write_text("")
    indent = "def f():\n    " if lazy else ""
    (root / "model" / "a.py").write_text(f"{indent}from hetsgd.model import b\n")
    (root / "model" / "b.py").write_text("import hetsgd.model.a\nfrom hetsgd.outputs.plots import x\n")
    (root / "outputs" / "plots.py").write_text("x = 1\n")
    graph = import_graph(root, "hetsgd")
    assert circles(graph) == [["hetsgd.model.a", "hetsgd.model.b"]]
    assert upward_imports(graph) == ["hetsgd.model.b -> hetsgd.outputs.plots"]


@pytest.mark.integration
def test_the_command_line_and_the_config_load_no_torch() -> None:
    """`hetsgd data list`, `report` and `plot` start without torch; the schemas never need it."""
    code = ("import sys, hetsgd.cli, hetsgd.config; "
            "print(sorted(m for m in ('torch', 'torch.distributed', 'psutil') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torch" not in done.stdout


@pytest.mark.integration
@pytest.mark.parametrize("command", [["--help"], ["data", "list"], ["report", "--help"],
                                     ["run", "seed=-1", "progress=false"]])
def test_commands_load_only_what_they_use(command: list[str], tmp_path: Path) -> None:
    """`hetsgd --help` parses without the data stack (scikit-learn, pandas); no command that
    trains nothing loads torch or matplotlib's pyplot (a run the checks refuse included: it
    writes only its failed run directory, with pandas), and only reading data loads
    scikit-learn."""
    code = ("import sys; from hetsgd.cli import app\n"
            f"try: app({command!r})\nexcept SystemExit: pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'matplotlib.pyplot', 'sklearn', 'pandas') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "HETSGD_RESULTS": str(tmp_path)})
    loaded = done.stdout.rsplit("LOADED", 1)[1].strip()
    expected = "['pandas']" if command[0] in ("data", "run") else "[]"
    assert loaded == expected, done.stdout
