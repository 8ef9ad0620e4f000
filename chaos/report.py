"""The chaos run's report: ``RESULTS.md`` (verdicts and recovery per fault kind) and a plot."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from bench.report import machine_facts
from chaos.faults import Fault, by_kind, percentile
from chaos.run import Outcome, Shape


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def verdicts(out: Outcome) -> list[tuple[str, str, bool]]:
    """(what, value, as it must be) for each promise the run checks."""
    t = out.tally
    completed = sum(1 for s in out.turns.values() if s == "completed")
    return [
        ("turns submitted / completed", f"{len(out.turns)} / {completed}", True),
        ("turns lost (not ended)", str(len(out.lost)), not out.lost),
        ("turns failed (ended with an error)", str(len(out.failures)), not out.failures),
        ("blind re-sends of unsafe tools", str(sum(t.blind_resends.values())), not t.blind_resends),
        ("re-runs of the safe tool (allowed)", str(t.safe_reruns), True),
        ("executions left UNKNOWN (reconciled)", str(len(out.unknown)), True),
        (
            "... of a tool that could have been settled",
            str(len(out.unexpected_unknown)),
            not out.unexpected_unknown,
        ),
    ]


def passed(out: Outcome) -> bool:
    return all(ok for _, _, ok in verdicts(out))


def command(shape: Shape) -> str:
    faults = "" if shape.faults == 240 else f" --faults {shape.faults}"
    return f"python -m chaos run{faults} --seed {shape.seed}"


def markdown(out: Outcome, plot: str | None) -> str:
    shape = out.shape
    deployment = out.deployment or (
        f"{shape.brains} Brains and {shape.hands} Hands workers (route `chaos`), {shape.in_flight} turns"
        f" in flight, each tool holding {shape.hold} s before and after its call; processes that exit are"
        " restarted, as a restart policy would"
    )
    lines = [
        "# Chaos run results",
        "",
        f"`{out.command or command(shape)}`, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC,"
        f" {out.seconds / 60:.1f} minutes: {deployment} ({out.restarts} restarts in all). How the run"
        " works: `docs/chaos/README.md`.",
        "",
        "| verdict | value | |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {what} | {value} | {'ok' if ok else '**NO**'} |" for what, value, ok in verdicts(out)]
    lines += [
        "",
        "Recovery: seconds from the fault's end (the kill, the SIGCONT, the cut, the end of the stall,"
        " the service back up) until every turn that was in flight when it hit had ended (a turn"
        " held by an UNKNOWN execution waits for a person, so it does not count); first progress:"
        " until the first of them ended. A turn takes about a second with no fault.",
        "",
        "| fault | injected | recovery p50 | p95 | max | first progress p50 | not recovered in 60 s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, hits in sorted(by_kind(out.injected).items(), key=lambda kv: list(Fault).index(kv[0])):
        times = [h.recovery for h in hits if h.recovery is not None]
        firsts = [h.first_progress for h in hits if h.first_progress is not None]
        cells = [
            percentile(times, 50),
            percentile(times, 95),
            max(times, default=None),
            percentile(firsts, 50),
        ]
        lines.append(
            f"| {kind.value} | {len(hits)} | {' | '.join(map(_s, cells))} | {len(hits) - len(times)} |"
        )
    lines += ["", f"{len(out.injected)} faults in all."]
    if plot:
        lines += ["", f"![recovery by fault kind]({plot})"]
    if out.failures:
        lines += ["", "Failed turns:", ""] + [f"- `{t}`: {e}" for t, e in sorted(out.failures.items())]
    if out.tally.blind_resends:
        lines += ["", "Operations of unsafe tools posted more than once:", ""]
        lines += [f"- `{op}`: {n} extra" for op, n in sorted(out.tally.blind_resends.items())]
    if out.lost:
        lines += ["", "Lost turns:", ""] + [f"- `{t}` ({out.turns[t]})" for t in sorted(out.lost)]
    facts = machine_facts()
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()), ""]
    return "\n".join(lines)


def plot(out: Outcome, path: Path) -> bool:
    """Recovery times per fault kind as a strip plot; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sorted(by_kind(out.injected).items(), key=lambda kv: list(Fault).index(kv[0]))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(groups) + 1.2))
    for row, (_, hits) in enumerate(groups):
        xs = [h.recovery for h in hits if h.recovery is not None]
        ax.scatter(xs, [row] * len(xs), s=14, alpha=0.6)
    ax.set_yticks(range(len(groups)), [k.value for k, _ in groups])
    ax.set_xlabel("seconds from the fault's end until every turn in flight at it had ended")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(out: Outcome, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    image = "recovery.png" if plot(out, directory / "recovery.png") else None
    path = directory / "RESULTS.md"
    path.write_text(markdown(out, image))
    return path
