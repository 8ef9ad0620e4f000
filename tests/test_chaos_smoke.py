"""The chaos run must not rot: `python -m chaos run --quick` against the local services, one
fault of each kind that leaves the services running. It passes only if its own verdicts held
(no turn lost, no blind re-send, no UNKNOWN that could have been settled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.faults import QUICK
from tests.support import REPO

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(400)]


def test_a_quick_chaos_run_holds_every_verdict_and_writes_its_results(
    pg_url: str, amqp_url: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "run", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=380,
        env={**os.environ, "BENCH_DATABASE_URL": pg_url, "BENCH_AMQP_URL": amqp_url},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    results = (tmp_path / "RESULTS.md").read_text()
    assert "| turns lost (not ended) | 0 | ok |" in results
    for kind in QUICK:
        assert f"| {kind.value} | 1 |" in results, results
