"""The command line every peer server takes: --workload and --port."""

from __future__ import annotations

import argparse

from bench.peers.models import WORKLOADS


def parse_server_args(doc: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--port", type=int, required=True)
    return parser.parse_args(argv)
