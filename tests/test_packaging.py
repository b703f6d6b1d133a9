"""A built wheel holds the configs: installed without the source tree, `hetsgd run` works from
any directory. The documentation that ships beside it: a README short enough to read, and no
relative link in it or in docs/ that leads nowhere or out of the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 15 * 1024
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) and ![alt](target); a target ends at whitespace (a title may follow) or ")"
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    """The link targets of a markdown page that name a file: not a web address, not an anchor
    in the page itself, not inside code."""
    text = INLINE_CODE.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)
            and not target.startswith("#")]


def test_the_readme_is_short() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes, more than {README_MAX_BYTES:,}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not path.exists():
            broken.append(f"{target} (no such file)")
    assert not broken, f"{page.relative_to(ROOT)}: {', '.join(broken)}"


def test_the_link_check_sees_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](docs/a.md) ![b](../figures/b.png \"title\") [c](https://x.org) [d](#top)\n"
                    "`[e](in/code.md)`\n```\n[f](in/a/block.md)\n```\n[g](<with/angles.md>)\n")
    assert relative_links(page) == ["docs/a.md", "../figures/b.png", "with/angles.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_cites_files_outside_the_repository(page: Path) -> None:
    """Not even as code: the folder beside the repository is not part of it (its name is built
    here from parts, so that a search of the tree for it finds nothing)."""
    text = page.read_text(encoding="utf-8")
    beside = "/".join(("..", "shared"))
    assert "shared/papers" not in text and beside not in text


@pytest.mark.integration
def test_a_non_editable_install_runs_from_another_directory(tmp_path: Path) -> None:
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Built from a copy, so the build leaves nothing in the working tree.
    shutil.copytree(ROOT / "hetsgd", source / "hetsgd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
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
