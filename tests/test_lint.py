"""The code stays as clean as CI says it is: ruff (lint and format) and mypy, run as the README's
test command runs everything else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=280
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_code_is_formatted_as_ruff_formats_it() -> None:
    done = _run("ruff", "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing_in_the_components(tmp_path: Path) -> None:
    done = _run("mypy", "--cache-dir", str(tmp_path), "brain", "hands", "protocol", "infra")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
