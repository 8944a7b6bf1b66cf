"""`make bench ... --rounds N`: the whole run N times in one sitting, the contenders' order reversed in
every other round, and issue 24's targets side by side per round (`rounds.md`).

On the 2-core development machine throughput drifts by 10-30 % within minutes
(docs/benchmarks/idle-cores-run), and a run measures its contenders one after another: a ratio between
two contenders then carries the drift between their turns. Reversing the order gives each contender
the early and the late turn; a target is met only if it is met in every round. Pure arithmetic over
the rounds' results.json, like stats.py.
"""

from __future__ import annotations

from typing import Optional, Sequence, TypeVar

from bench.compare import peer_targets
from bench.compare.report import PROJECT, VERDICTS, _fmt

T = TypeVar("T")


def round_order(chosen: Sequence[T], index: int) -> list[T]:
    """The contenders in round `index` (0-based): as given, reversed in every other round."""
    return list(chosen) if index % 2 == 0 else list(reversed(chosen))


def every_round(verdicts: Sequence[Optional[bool]]) -> Optional[bool]:
    """Met only if met in every round; not met if missed in any; not measured if never measured."""
    if any(v is False for v in verdicts):
        return False
    if verdicts and all(v is True for v in verdicts):
        return True
    return None


def summary_markdown(rounds: Sequence[dict]) -> str:
    """Issue 24's targets per serve-app mode: each round's figure, and the verdict over all rounds."""
    if not rounds:
        return ""
    first = rounds[0]
    names = [f"round {i + 1}" for i in range(len(rounds))]
    lines = [f"# Issue 24's targets over {len(rounds)} rounds ({first['profile']} profile)", "",
             "Each round is a whole run in [round-N/](round-1/results.md); the contenders' order is reversed in every "
             "other round. A target is met only if it is met in every round.", "",
             "| round | started | order |", "|---|---|---|"]
    lines += [f"| {i + 1} | {r['started_at']} | {', '.join(r['contenders'])} |" for i, r in enumerate(rounds)]
    failed = [{f["contender"] for f in r.get("failures", [])} for r in rounds]
    lines += [""] if any(failed) else []
    lines += [f"- round {i + 1}: {f['contender']} / {f['workload']} failed: `{f['error'][:200]}`"
              for i, r in enumerate(rounds) for f in r.get("failures", [])]
    contenders = first["contenders"]
    peers = [c for c in contenders if c not in PROJECT]
    for project in [p for p in PROJECT if p in contenders]:
        per_round = [_without_failed_peers(peer_targets.targets(r, project, [p for p in peers if p in r["contenders"]]),
                                           sorted(gone & set(peers)))
                     for r, gone in zip(rounds, failed)]
        lines += ["", f"## {first['labels'].get(project, project)} against {', '.join(peers) or 'no peer'}", "",
                  "| target | " + " | ".join(names) + " | verdict |", "|---" * (len(names) + 2) + "|"]
        for row, *others in zip(*per_round, strict=True):
            figures = [row] + others
            cells = [f"{_fmt(t['figure'], 2)} ({t['detail']})" if t["detail"] else _fmt(t["figure"], 2)
                     for t in figures]
            verdict = VERDICTS[every_round([t["met"] for t in figures])]
            lines.append(f"| {row['target']} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines) + "\n"


def _without_failed_peers(rows: list[dict], gone: list[str]) -> list[dict]:
    """A lead over "every peer" is not measured in a round where a peer failed: it would be judged against
    the weaker ones."""
    if not gone:
        return rows
    return [dict(t, met=None, detail=f"{t['detail']}; failed: {', '.join(gone)}") if t.get("versus_peers")
            else t for t in rows]


__all__ = ["every_round", "round_order", "summary_markdown"]
