"""Write the results: a Markdown table (README.md), raw JSON and PNG plots."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.scenarios.base import Row


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "–"
    return f"{a / b:.2f}x"


def machine_facts() -> dict[str, str]:
    """Facts that matter to read the numbers."""
    facts = {"cpus": str(os.cpu_count()), "python": platform.python_version(), "kernel": platform.release()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(ln for ln in cpuinfo if ln.startswith("model name"))
        facts["cpu"] = model.split(":", 1)[1].strip()
        mem = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
        facts["memory"] = mem.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        pass
    for name, cmd in (("postgresql", ["psql", "--version"]), ("rabbitmq", ["rabbitmqctl", "version"])):
        try:
            facts[name] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            facts[name] = "?"
    return facts


def table(rows: list[Row]) -> str:
    head = (
        "| scenario | metric | unit | Tendon | floor | Tendon/floor | Celery | Tendon/Celery "
        "| DBOS | Tendon/DBOS | target | note |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n"
    )
    lines = [
        f"| {r.scenario} | {r.metric} | {r.unit} | {_fmt(r.tendon)} | {_fmt(r.floor)} | "
        f"{_fmt_ratio(r, r.floor)} | {_fmt(r.celery)} | {_fmt_ratio(r, r.celery)} | "
        f"{_fmt(r.dbos)} | {_fmt_ratio(r, r.dbos)} | {r.target} | {r.note} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def _fmt_ratio(r: Row, other: float | None) -> str:
    return _ratio(r.tendon, other)


def _wrap(label: str, width: int = 22) -> str:
    """Break a long tick label into lines of about ``width`` characters."""
    lines: list[str] = []
    for word in label.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def plots(series: dict[str, Any], out: Path) -> list[str]:
    """PNG plots with matplotlib (Agg); returns file names, or [] if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    lat = series.get("latency")
    if lat:
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label in (
            ("tendon_1", "Tendon 1 call"),
            ("floor_1", "floor 1 call"),
            ("tendon_2", "Tendon 2 calls"),
            ("floor_2", "floor 2 calls"),
            ("dbos_1", "DBOS 1-step workflow (at the caller)"),
        ):
            xs = sorted(v * 1000 for v in lat.get(key, []))
            if xs:
                ax.plot(xs, [i / len(xs) for i in range(1, len(xs) + 1)], label=label)
        ax.set_xlabel("submit to completed (ms)")
        ax.set_ylabel("fraction of turns")
        ax.set_title("Sequential latency (CDF)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=100)
        plt.close(fig)
        written.append("latency.png")
    thr = series.get("throughput")
    if thr:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, points in thr.items():
            if points:
                ks = sorted(points, key=int)
                ax.plot([int(k) for k in ks], [points[k] for k in ks], marker="o", label=name)
        ax.set_xlabel("tool calls in flight")
        ax.set_ylabel("tool calls / s")
        ax.set_xscale("log")
        ax.set_title("Throughput (median of repeats)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=100)
        plt.close(fig)
        written.append("throughput.png")
    cpu = series.get("cpu")
    if cpu:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(cpu)
        roles = sorted({role for per in cpu.values() for role in per})
        bottom = [0.0] * len(names)
        for role in roles:
            heights = [cpu[name].get(role, 0.0) for name in names]
            ax.bar(names, heights, bottom=bottom, label=role)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_ylabel("CPU ms per tool call")
        ax.set_title("Where the CPU of one call goes (50 in flight)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "cpu.png", dpi=100)
        plt.close(fig)
        written.append("cpu.png")
    rec = series.get("recovery")
    if rec:
        fig, ax = plt.subplots(figsize=(9, 5))
        labels = [k for k, v in rec.items() if v]
        ax.boxplot([rec[k] for k in labels])
        ax.set_xticks(range(1, len(labels) + 1), [_wrap(k) for k in labels], fontsize=7)
        ax.set_ylabel("seconds")
        ax.set_title("Recovery after SIGKILL")
        fig.tight_layout()
        fig.savefig(out / "recovery.png", dpi=100)
        plt.close(fig)
        written.append("recovery.png")
    return written


def write(out: Path, rows: list[Row], series: dict[str, Any], notes: list[str], meta: dict[str, Any]) -> Path:
    """Write README.md (or RESULTS.md for --out elsewhere), results.json and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = plots(series, out)
    facts = machine_facts()
    (out / "results.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "machine": facts,
                "rows": [r.__dict__ for r in rows],
                "series": series,
                "notes": notes,
            },
            indent=1,
            default=str,
        )
    )
    parts = [
        f"## Results ({meta['mode']} mode, {meta['started']}, {meta['seconds']:.0f} s, "
        f"submits over {meta.get('submit', 'api')})\n",
        "Every figure is a median or percentile over the repeats of this run; every ratio is "
        "Tendon divided by the column it names, measured in the same run (lower is better for "
        "times and costs, higher is better for throughput).\n",
        table(rows),
        "\n**Machine:** " + "; ".join(f"{k}: {v}" for k, v in facts.items()) + "\n",
    ]
    if notes:
        parts.append("\n**Notes from this run:**\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    if pngs:
        parts.append("\n" + "\n".join(f"![{p}]({p})" for p in pngs) + "\n")
    path = out / "RESULTS.md"
    path.write_text("\n".join(parts))
    return path
