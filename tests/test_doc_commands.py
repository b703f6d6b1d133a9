"""Every `hetsgd` command line that README.md and docs/own_problem.md show still works as written,
without training anything: a `hetsgd run` line composes into a config that the schema's checks
accept (for a sweep, enough of its jobs to try every swept value), and any other line names a
subcommand of the command line and options it has.

A page's shell blocks are read as a shell would: continued lines joined, comments dropped,
variables set in the block substituted, and ``<id>``-style placeholders taken as plain words.
Files a page shows in full (a block whose first line is a comment naming its path, such as
``# myconf/model/mynet.yaml``) are written into a scratch folder the lines run in."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from hetsgd.cli import app
from hetsgd.config import compose_run, to_run_config
from hetsgd.config.compose import sweep_jobs

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/own_problem.md")
SHELL = ("", "sh", "bash", "shell", "console")
SHOWN_FILE = re.compile(r"#\s*(\S+\.(?:ya?ml|py))\b")
PLACEHOLDER = re.compile(r"<([A-Za-z_]+)>")
ASSIGNMENT = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence
    lang: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Command:
    where: str  # page:line
    args: tuple[str, ...]  # after `hetsgd`


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a markdown page, in order."""
    found, current, start, lang = [], None, 0, ""
    for number, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number, line[3:].strip()
            else:
                found.append(Block(page, start, lang, tuple(current)))
                current = None
        elif current is not None:
            current.append(line)
    return found


def commands(block: Block) -> list[Command]:
    """The `hetsgd` command lines of a shell block, each alternative of ``a | b`` (``hetsgd data
    list | info w8a``) its own command under the same group."""
    found, variables, logical, first = [], {}, "", 0
    for offset, line in enumerate(block.lines, 1):
        first = first or offset
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical, text, first_line = "", logical + line, first
        first = 0
        if (assigned := ASSIGNMENT.fullmatch(text.strip())) is not None:
            variables[assigned[1]] = shlex.split(assigned[2])[0]
            continue
        for name, value in variables.items():
            text = text.replace(f"${name}", value)
        tokens = [_unbracketed(PLACEHOLDER.sub(r"\1", t)) for t in shlex.split(text, comments=True)]
        if not tokens or tokens[0] != "hetsgd":
            continue
        where = f"{block.page}:{block.line + first_line}"
        segments = " ".join(tokens[1:]).split(" | ")
        head = segments[0].split()
        found.append(Command(where, tuple(head)))
        found += [Command(where, (*head[:1], *segment.split())) for segment in segments[1:]]
    return found


def _unbracketed(token: str) -> str:
    """A token without the brackets around an optional part (``[--calibrate ...]``); a bracketed
    value (``[1,8,8]``) keeps its own."""
    if token.startswith("[") and "]" not in token:
        token = token[1:]
    return token[:-1] if token.endswith("]") and "[" not in token else token


def shown_files(page: str) -> dict[str, str]:
    """Files the page shows in full: path -> text."""
    return {match[1]: "\n".join(b.lines) + "\n" for b in blocks(page)
            if b.lines and (match := SHOWN_FILE.match(b.lines[0]))}


COMMANDS = [c for page in PAGES for b in blocks(page) if b.lang in SHELL for c in commands(b)]
RUNS = [c for c in COMMANDS if c.args[:1] == ("run",)]
OTHERS = [c for c in COMMANDS if c.args[:1] != ("run",)]


def covering(jobs: list[list[str]]) -> list[list[str]]:
    """Jobs of a sweep until every override any job has appears in one of them: each swept value
    is tried once, without composing every combination."""
    seen: set[str] = set()
    chosen = []
    for job in jobs:
        if not set(job) <= seen:
            chosen.append(job)
            seen.update(job)
    return chosen


def run_overrides(args: tuple[str, ...]) -> list[list[str]]:
    """The overrides of each job that ``hetsgd run ARGS`` would compose (covering a sweep's
    values), with ``--config-dir`` as the search path it adds; ``--cfg`` only prints."""
    overrides, sweep, rest = [], False, list(args[1:])
    while rest:
        arg = rest.pop(0)
        if arg in ("-m", "--multirun"):
            sweep = True
        elif arg in ("-c", "--cfg"):
            rest.pop(0)
        elif arg == "--dry-run":  # the same jobs, checked only
            continue
        elif arg in ("-cd", "--config-dir"):
            overrides.append(f"hydra.searchpath=[file://{Path(rest.pop(0)).resolve()}]")
        else:
            assert not arg.startswith("-"), f"a flag this test does not know: {arg}"
            overrides.append(arg)
    return covering(sweep_jobs(overrides)) if sweep else [overrides]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pages' shown files, written where the command lines expect them."""
    for page in PAGES:
        for name, text in shown_files(page).items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_pages_show_the_commands_this_test_checks() -> None:
    """The parsing itself: a sweep, a continued line, a variable, and the ``a | b`` shorthand."""
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert where == set(PAGES)
    assert ("run", "-m", "algo=hogbatch,adaptive", "devices=emulated", "seed=0,1,2") in \
        [c.args for c in RUNS]
    assert any("+model.input_shape=[1,8,8]" in c.args and "dataset=digits" in c.args
               for c in RUNS)  # joined across the backslash, after $MODEL was substituted
    assert {("data", "list"), ("data", "info", "w8a"), ("data", "fetch", "w8a")} <= \
        {c.args for c in OTHERS}
    assert "myconf/model/mynet.yaml" in shown_files("docs/own_problem.md")


@pytest.mark.parametrize("command", RUNS, ids=lambda c: c.where)
def test_a_run_line_composes_and_passes_the_checks(command: Command, scratch: Path) -> None:
    for overrides in run_overrides(command.args):
        to_run_config(compose_run(overrides))


def _subcommand(args: tuple[str, ...]) -> tuple[list[str], Any]:
    """The subcommand path at the head of ``args`` (``data info``) and its command (Typer's own
    click; a group has ``commands``)."""
    command = typer.main.get_command(app)
    path: list[str] = []
    for arg in args:
        if arg not in getattr(command, "commands", {}):
            break
        command = command.commands[arg]  # type: ignore[attr-defined]
        path.append(arg)
    return path, command


@pytest.mark.parametrize("command", OTHERS, ids=lambda c: f"{c.where} {' '.join(c.args[:2])}")
def test_another_line_names_a_subcommand_and_its_options(command: Command, scratch: Path) -> None:
    path, found = _subcommand(command.args)
    if not path and all(arg.startswith("--") for arg in command.args):  # the command's own
        assert set(command.args) <= {opt for param in found.params for opt in param.opts}
        return
    assert path and not hasattr(found, "commands"), f"no such subcommand: {command.args}"
    options = {opt for param in found.params for opt in (*param.opts, *param.secondary_opts)}
    unknown = [arg for arg in command.args if arg.startswith("-") and arg not in options]
    assert not unknown, f"hetsgd {' '.join(path)} has no option {', '.join(unknown)}"
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    if path == ["machine"] and "--calibrate" in command.args:  # its other arguments: overrides
        to_run_config(compose_run([arg for arg in command.args[1:] if not arg.startswith("-")]))
