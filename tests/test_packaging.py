"""A built wheel holds the configs: installed without the source tree, `hetsgd run` works from
any directory. The documentation that ships beside it: a README short enough to read, and no
relative link in it or in docs/ that leads nowhere or out of the repository."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 15 * 1024


def _is_page(path: Path) -> bool:
    """A markdown file of the repository's own: not in a hidden folder (git's, caches, the
    virtualenv), a build's metadata, or a run's folder under results/ (reports runs wrote)."""
    parts = path.relative_to(ROOT).parts
    return path.suffix == ".md" and not (
        any(part.startswith(".") or part.endswith(".egg-info") for part in parts[:-1])
        or (parts[0] == "results" and len(parts) > 2))


def _pages() -> list[Path]:
    pages = []
    for folder, subfolders, files in os.walk(ROOT):
        here = Path(folder)
        subfolders[:] = [d for d in subfolders if _is_page(here / d / "page.md")]  # prune
        pages += [here / f for f in files if _is_page(here / f)]
    return sorted(pages)


PAGES = _pages()
# [text](target) and ![alt](target); a target ends at whitespace (a title may follow) or ")"
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path, *, anchors_here: bool = False) -> list[str]:
    """The link targets of a markdown page that name a file: not a web address, not inside
    code, not an anchor in the page itself unless ``anchors_here``."""
    text = INLINE_CODE.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)
            and (anchors_here or not target.startswith("#"))]


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation other than - and _
    dropped, spaces made -, a repeated one suffixed -1, -2, ..."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    for line in FENCED.sub("", page.read_text(encoding="utf-8")).splitlines():
        if (heading := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)) is not None:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            repeats = counts[slug] = counts.get(slug, 0) + 1
            anchors.add(slug if repeats == 1 else f"{slug}-{repeats - 1}")
    return anchors


def test_the_readme_is_short() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes, more than {README_MAX_BYTES:,}"


def broken_links(page: Path, root: Path) -> list[str]:
    """The relative links of `page` that leave the repository at `root`, name no file, or name
    a heading their page does not have."""
    broken = []
    for target in relative_links(page, anchors_here=True):
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.is_relative_to(root):
            broken.append(f"{target} (outside the repository)")
        elif not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_markdown_file_of_the_repository_is_checked() -> None:
    assert {ROOT / "README.md", ROOT / "docs" / "architecture.md"} <= set(PAGES)
    assert not any(".venv" in page.parts for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = broken_links(page, ROOT)
    assert not broken, f"{page.relative_to(ROOT)}: {', '.join(broken)}"


def test_the_link_check_finds_links_out_of_the_repository_and_to_nothing(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "here.md").write_text("here")
    (tmp_path / "beside.md").write_text("outside, but it exists")
    (root / "docs" / "there.md").write_text("# Where it goes\n## The `run`: 2 steps\n## Notes\n"
                                           "## Notes\n```\n# not a heading\n```\n")
    page = root / "docs" / "page.md"
    page.write_text("[ok](here.md) [out](../../beside.md) [gone](../missing.md#part)\n"
                    "[a](there.md#where-it-goes) [b](there.md#the-run-2-steps) [c](there.md#notes-1)"
                    " [d](there.md#notes-2) [e](there.md#not-a-heading) [f](#top) [g](#own)\n"
                    "## Own\n")
    assert broken_links(page, root) == ["../../beside.md (outside the repository)",
                                        "../missing.md#part (no such file)",
                                        "there.md#notes-2 (no such heading)",
                                        "there.md#not-a-heading (no such heading)",
                                        "#top (no such heading)"]


def test_the_link_check_sees_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](docs/a.md) ![b](../figures/b.png \"title\") [c](https://x.org) [d](#top)\n"
                    "`[e](in/code.md)`\n```\n[f](in/a/block.md)\n```\n[g](<with/angles.md>)\n")
    assert relative_links(page) == ["docs/a.md", "../figures/b.png", "with/angles.md"]


@pytest.mark.integration
def test_a_non_editable_install_runs_from_another_directory(tmp_path: Path) -> None:
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Built from a copy, so the build leaves nothing in the working tree.
    shutil.copytree(ROOT / "hetsgd", source / "hetsgd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(source)], check=True, capture_output=True, timeout=300)
    wheel, = wheels.glob("hetsgd-*.whl")
    assert "hetsgd/conf/config.yaml" in zipfile.ZipFile(wheel).namelist()
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    # The installed copy comes first on the path; the dependencies come from this interpreter.
    env = {**os.environ, "PYTHONPATH": str(site), "HETSGD_RESULTS": str(elsewhere / "results")}
    env.pop("HETSGD_CONF", None)
    where = subprocess.run([sys.executable, "-c", "import hetsgd; print(hetsgd.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)
    run = subprocess.run([sys.executable, "-m", "hetsgd", "run", "budget.epochs=1",
                          "progress=false"], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary, = (elsewhere / "results" / "runs").glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"


def test_every_module_of_the_package_imports() -> None:
    """Each module on its own, as a user's ``import`` or a lazy import meets it; ``__main__`` is
    left out, since importing it runs the command."""
    import hetsgd

    names = [info.name for info in pkgutil.walk_packages(hetsgd.__path__, "hetsgd.")
             if info.name != "hetsgd.__main__"]
    assert "hetsgd.engines.virtual.model_cost" in names  # the walk reaches nested packages
    for name in names:
        importlib.import_module(name)


def third_party_imports(package: Path) -> set[str]:
    """The top-level names of the absolute imports in ``package``'s sources, lazy ones included,
    that are neither the standard library's nor hetsgd's own."""
    names = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "hetsgd"}


def test_every_third_party_import_is_declared() -> None:
    """Each library the package imports is a dependency or in an extra, under the name of the
    distribution that provides it here (an import not installed here must be named as its
    distribution is)."""
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                                 for r in extra)]

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {canonical(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}
    providers = importlib.metadata.packages_distributions()
    imports = third_party_imports(ROOT / "hetsgd")
    assert {"torch", "yaml", "omegaconf"} <= imports  # the scan sees top-level and from-imports
    missing = sorted(f"{name} ({', '.join(providers.get(name, [name]))})" for name in imports
                     if not any(canonical(d) in declared for d in providers.get(name, [name])))
    assert not missing, f"imported but not declared in pyproject.toml: {', '.join(missing)}"
