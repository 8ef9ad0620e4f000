"""What every scenario gets and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import Processes, Services


@dataclass
class Context:
    """The run: services, process registry, mode and output directory."""

    services: Services
    procs: Processes
    quick: bool
    out: Path
    waiting: int | None = None  # turns the waiting scenario parks (None: its default)
    notes: list[str] = field(default_factory=list)

    def n(self, quick: int, full: int) -> int:
        return quick if self.quick else full


@dataclass
class Row:
    """One line of the results table; ``None`` means not measured (see notes)."""

    scenario: str
    metric: str
    unit: str
    tendon: float | None = None
    floor: float | None = None
    celery: float | None = None
    dbos: float | None = None
    target: str = ""
    note: str = ""


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
