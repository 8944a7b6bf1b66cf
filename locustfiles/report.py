"""Summarise a Locust run from its CSV files.

    python locustfiles/report.py reports/stress_matrix [--title "..."]

reads `<prefix>_stats.csv` and `<prefix>_stats_history.csv` (run Locust with
`--csv <prefix> --csv-full-history`; without full history the shed ratio and
the per-cell spans cannot be computed) and writes:

  <prefix>_summary.png  throughput, p50/p95/p99 and shed/error ratio over time
  <prefix>_matrix.md    stress matrix only: one row per cell (requests, success %,
                        shed %, p50/p95/p99, throughput)
  <prefix>_steps.md     when the user count changes (step_ramp, burst): one row per step

Shed rows are the ones Locust recorded as `<name> [shed]` (503 answers).
Needs matplotlib; no Locust import.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from slo import SHED_SUFFIX

CELL_RE = re.compile(r"(?P<records>\d+)rec @(?P<pacing>[\d.]+)s$")


def _num(value: str) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@dataclass
class Cell:
    name: str
    records: int
    pacing: float
    requests: int = 0
    failures: int = 0
    shed: int = 0
    p50: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    start: Optional[float] = None
    end: Optional[float] = None
    users: int = 0

    @property
    def total(self) -> int:
        return self.requests + self.shed

    @property
    def ok(self) -> int:
        return self.requests - self.failures

    @property
    def seconds(self) -> Optional[float]:
        return None if self.start is None or self.end is None else max(self.end - self.start, 1.0)


def matrix_cells(stats: list[dict[str, str]], history: list[dict[str, str]]) -> list[Cell]:
    """Cells found in the stats rows named `... <n>rec @<p>s` (and their `[shed]` twins)."""
    cells: dict[str, Cell] = {}
    for row in stats:
        name = row["Name"]
        base = name[: -len(SHED_SUFFIX)] if name.endswith(SHED_SUFFIX) else name
        m = CELL_RE.search(base)
        if not m:
            continue
        cell = cells.setdefault(base, Cell(base, int(m["records"]), float(m["pacing"])))
        if name.endswith(SHED_SUFFIX):
            cell.shed = int(row["Request Count"])
        else:
            cell.requests, cell.failures = int(row["Request Count"]), int(row["Failure Count"])
            cell.p50, cell.p95, cell.p99 = _num(row["50%"]), _num(row["95%"]), _num(row["99%"])
    # time span and users of each cell: history rows whose running total grew
    last_count: dict[str, int] = {}
    for row in history:
        name = row["Name"]
        base = name[: -len(SHED_SUFFIX)] if name.endswith(SHED_SUFFIX) else name
        if base not in cells:
            continue
        count = int(row["Total Request Count"] or 0)
        if count > last_count.get(name, 0):
            ts = float(row["Timestamp"])
            cell = cells[base]
            cell.start = ts - 1 if cell.start is None else min(cell.start, ts - 1)
            cell.end = ts if cell.end is None else max(cell.end, ts)
            cell.users = max(cell.users, int(row["User Count"] or 0))
            last_count[name] = count
    return sorted(cells.values(), key=lambda c: (c.records, -c.pacing))


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}" if whole else "n/a"


def _ms(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def matrix_markdown(cells: list[Cell]) -> str:
    lines = [
        "| records/request | pacing per user | users | offered req/s | requests | success % | shed % "
        "| error % | p50 ms | p95 ms | p99 ms | answered req/s | records/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        secs = c.seconds
        rps = c.ok / secs if secs else None
        offered = c.users / c.pacing if c.users else None
        lines.append(
            f"| {c.records} | {c.pacing:g} s | {c.users or 'n/a'} | "
            f"{'n/a' if offered is None else f'{offered:.0f}'} | {c.total} | {_pct(c.ok, c.total)} | "
            f"{_pct(c.shed, c.total)} | {_pct(c.failures, c.total)} | {_ms(c.p50)} | {_ms(c.p95)} | "
            f"{_ms(c.p99)} | {'n/a' if rps is None else f'{rps:.1f}'} | "
            f"{'n/a' if rps is None else f'{rps * c.records:.0f}'} |"
        )
    return "\n".join(lines) + "\n"


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    users: list[int] = field(default_factory=list)
    p50: list[Optional[float]] = field(default_factory=list)
    p95: list[Optional[float]] = field(default_factory=list)
    p99: list[Optional[float]] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    total_fail: list[int] = field(default_factory=list)
    total_shed: list[int] = field(default_factory=list)


def time_series(history: list[dict[str, str]]) -> tuple[Series, float]:
    """Aggregated rows (one a second), plus the running total of the `[shed]` rows."""
    shed_total: dict[str, int] = {}
    shed_by_name_total: dict[str, int] = {}
    for row in history:
        if row["Name"].endswith(SHED_SUFFIX):
            ts = row["Timestamp"]
            shed_by_name_total[row["Name"]] = int(row["Total Request Count"] or 0)
            shed_total[ts] = sum(shed_by_name_total.values())
    s = Series()
    t0 = None
    running_shed = 0
    for row in history:
        if row["Name"] != "Aggregated":
            continue
        ts = float(row["Timestamp"])
        t0 = ts if t0 is None else t0
        running_shed = shed_total.get(row["Timestamp"], running_shed)
        s.t.append(ts - t0)
        s.users.append(int(row["User Count"] or 0))
        s.p50.append(_num(row["50%"]))
        s.p95.append(_num(row["95%"]))
        s.p99.append(_num(row["99%"]))
        s.total.append(int(row["Total Request Count"] or 0))
        s.total_fail.append(int(row["Total Failure Count"] or 0))
        s.total_shed.append(running_shed)
    return s, (t0 or 0.0)


def steps_markdown(s: Series) -> Optional[str]:
    """One row per run of equal user count (step_ramp, burst); None for a constant run."""
    runs: list[tuple[int, int, int]] = []  # (users, first index, last index)
    for i, u in enumerate(s.users):
        if runs and runs[-1][0] == u:
            runs[-1] = (u, runs[-1][1], i)
        else:
            runs.append((u, i, i))
    runs = [r for r in runs if r[0] > 0 and r[2] > r[1]]
    if len(runs) < 2:
        return None
    lines = ["| step | users | seconds | req/s | answered req/s | shed % | error % | p50 ms | p95 ms | p99 ms |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, (u, a, b) in enumerate(runs, 1):
        secs = s.t[b] - s.t[a] or 1.0
        req = s.total[b] - s.total[a]
        fail = s.total_fail[b] - s.total_fail[a]
        shed = s.total_shed[b] - s.total_shed[a]
        # latency: the last full-window percentiles of the step (Locust's rolling ~10 s window)
        lines.append(
            f"| {k} | {u} | {secs:.0f} | {req / secs:.1f} | {(req - fail - shed) / secs:.1f} | "
            f"{_pct(shed, req)} | {_pct(fail, req)} | {_ms(s.p50[b])} | {_ms(s.p95[b])} | {_ms(s.p99[b])} |"
        )
    return "\n".join(lines) + "\n"


def _rates(t: list[float], totals: list[int], smooth: int = 3) -> list[float]:
    """Per-second rate from running totals (differences), centred moving average over `smooth` points."""
    raw = [0.0] + [max(totals[i] - totals[i - 1], 0) / max(t[i] - t[i - 1], 1e-9) for i in range(1, len(t))]
    half = smooth // 2
    return [sum(raw[max(0, i - half): i + half + 1]) / len(raw[max(0, i - half): i + half + 1])
            for i in range(len(raw))]


def plot(s: Series, cells: list[Cell], t0: float, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    # throughput from the running totals (1 s resolution, 3 s smoothing); Locust's own
    # "Requests/s" column is a 10 s rolling mean that smears the matrix cells into each other
    sent = _rates(s.t, s.total)
    failed = _rates(s.t, s.total_fail)
    shed = _rates(s.t, s.total_shed)
    answered = [max(a - b - c, 0.0) for a, b, c in zip(sent, failed, shed)]
    ax1.plot(s.t, sent, label="sent req/s", color="tab:blue")
    ax1.plot(s.t, answered, label="answered OK req/s", color="tab:green", linestyle="--")
    ax1.plot(s.t, shed, label="shed (503) req/s", color="tab:orange")
    ax1.plot(s.t, failed, label="failed req/s", color="tab:red")
    ax1.set_ylabel("requests / s")
    ax1b = ax1.twinx()
    ax1b.step(s.t, s.users, where="post", color="grey", alpha=0.5, label="users")
    ax1b.set_ylabel("users", color="grey")
    ax1.legend(handles=ax1.get_lines() + ax1b.get_lines(), loc="upper left", bbox_to_anchor=(1.06, 1.0),
               fontsize=8)

    def clean(values):
        return [float("nan") if v is None else v for v in values]

    ax2.plot(s.t, clean(s.p50), label="p50")
    ax2.plot(s.t, clean(s.p95), label="p95")
    ax2.plot(s.t, clean(s.p99), label="p99")
    ax2.set_ylabel("latency ms\n(Locust's 10 s window)")
    ax2.set_yscale("log")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=8)

    shed_ratio = [100 * sh / r if r else 0.0 for sh, r in zip(shed, sent)]
    error_ratio = [100 * f / r if r else 0.0 for f, r in zip(failed, sent)]
    ax3.plot(s.t, shed_ratio, label="shed %", color="tab:orange")
    ax3.plot(s.t, error_ratio, label="error %", color="tab:red")
    ax3.set_ylabel("% of requests")
    ax3.set_ylim(-2, 102)
    ax3.set_xlabel("seconds since start")
    ax3.legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=8)

    for i, c in enumerate(cells):
        if c.start is None:
            continue
        for ax in (ax1, ax2, ax3):
            ax.axvspan(c.start - t0, c.end - t0, color="tab:purple" if i % 2 else "tab:cyan", alpha=0.07)
        ax1.annotate(f"{c.records}rec @{c.pacing:g}s", ((c.start + c.end) / 2 - t0, 1.01),
                     xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prefix", help="the --csv prefix of the run, e.g. reports/stress_matrix")
    p.add_argument("--title", default=None)
    p.add_argument("--png", default=None, help="default: <prefix>_summary.png")
    args = p.parse_args(argv)
    prefix = Path(args.prefix)
    stats_path = Path(f"{prefix}_stats.csv")
    history_path = Path(f"{prefix}_stats_history.csv")
    if not stats_path.is_file() or not history_path.is_file():
        print(f"report: {stats_path} or {history_path} missing", file=sys.stderr)
        return 2
    stats, history = read_csv(stats_path), read_csv(history_path)
    if not any(r["Name"] != "Aggregated" for r in history):
        print("report: the history has only Aggregated rows; run Locust with --csv-full-history "
              "for the shed ratio and per-cell spans", file=sys.stderr)
    series, t0 = time_series(history)
    cells = matrix_cells(stats, history)
    png = Path(args.png) if args.png else Path(f"{prefix}_summary.png")
    plot(series, cells, t0, args.title or prefix.name, png)
    print(f"report: wrote {png}")
    if cells:
        md = Path(f"{prefix}_matrix.md")
        md.write_text(matrix_markdown(cells))
        print(f"report: wrote {md}\n\n{md.read_text()}")
    else:
        steps = steps_markdown(series)
        if steps:
            md = Path(f"{prefix}_steps.md")
            md.write_text(steps)
            print(f"report: wrote {md}\n\n{steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
