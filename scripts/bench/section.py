"""A section of the bench: one measurement, rendered to the terminal, markdown and JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.table import Table


@dataclass
class Section:
    title: str
    explanation: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # absolute numbers, for bench.json
    error: str | None = None
    load: str = ""  # how busy the rest of the machine was meanwhile
    notes: list[str] = field(default_factory=list)  # e.g. the profile behind a missed goal
    key: str = ""  # its letter in BENCHES, set when it is measured

    def table(self) -> Table:
        # escaped: an override such as devices.only=[cpu] is not rich markup
        table = Table(*self.columns, title=f"{self.key}. {self.title}",
                      caption=escape("\n".join([f"{self.explanation} {self.load}", *self.notes])),
                      title_justify="left",
                      caption_justify="left")
        for row in self.rows:
            table.add_row(*row)
        if self.error:
            table.add_row(f"[red]failed: {self.error}[/red]", *[""] * (len(self.columns) - 1))
        return table

    def markdown(self) -> str:
        lines = [f"## {self.key}. {self.title}", "", f"{self.explanation} {self.load}", "",
                 "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes] if self.notes else []
        if self.error:
            lines += ["", f"**failed:** {self.error}"]
        return "\n".join(lines) + "\n"


def ratio(value: float | None, baseline: float | None) -> float | None:
    return value / baseline if value is not None and baseline else None


def fmt(value: float | None, spec: str = ".3g", unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"
