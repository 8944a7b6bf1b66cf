"""What the phases of bench.gpu share: the sizes of each mode (GPU, --quick, --tiny CPU), percentiles,
JSON files and the deadline every phase measures against."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE, TARGET = "en", "pt"


@dataclass(frozen=True)
class Plan:
    """How much each phase does: the GPU run, its --quick variant, and the --tiny CPU check."""

    decode_tokens: int  # fixed output length of the offline sweep and the Serve cells
    offline_batches: tuple[int, ...]
    offline_seconds: float  # per batch size
    cells: tuple[tuple[int, int], ...]  # (clients, records per request)
    cell_seconds: float
    continuous_cell_seconds: float  # the Serve cells of the second (continuous) start
    warmup_seconds: float
    ready_timeout_s: float
    mix_records: int  # sentences in the length mix
    mix_batch: int  # max_batch_size / max_running_sequences of the in-process contenders
    mix_clients: int
    saturation_requests: int
    half_requests: int
    solo_sentences: int
    fixed_saturation_requests: int


GPU_PLAN = Plan(decode_tokens=32, offline_batches=(1, 8, 32, 64, 128), offline_seconds=3.0,
                cells=((1, 1), (64, 1), (256, 1), (32, 16)), cell_seconds=14.0, continuous_cell_seconds=8.0,
                warmup_seconds=4.0, ready_timeout_s=150.0, mix_records=192, mix_batch=64, mix_clients=64,
                saturation_requests=192, half_requests=64, solo_sentences=16, fixed_saturation_requests=128)
QUICK_PLAN = Plan(decode_tokens=32, offline_batches=(1, 8, 64, 128), offline_seconds=1.5,
                  cells=((1, 1), (64, 1), (32, 16)), cell_seconds=6.0, continuous_cell_seconds=5.0,
                  warmup_seconds=3.0, ready_timeout_s=150.0, mix_records=128, mix_batch=64, mix_clients=64,
                  saturation_requests=128, half_requests=48, solo_sentences=12, fixed_saturation_requests=128)
TINY_PLAN = Plan(decode_tokens=8, offline_batches=(1, 8, 32), offline_seconds=1.0,
                 cells=((1, 1), (8, 1), (4, 8)), cell_seconds=3.0, continuous_cell_seconds=2.0,
                 warmup_seconds=1.0, ready_timeout_s=240.0, mix_records=24, mix_batch=8, mix_clients=8,
                 saturation_requests=24, half_requests=12, solo_sentences=6, fixed_saturation_requests=16)


def plan_for(tiny: bool, quick: bool) -> Plan:
    return TINY_PLAN if tiny else QUICK_PLAN if quick else GPU_PLAN


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` as make bench computes percentiles (bench.compare.stats); 0.0 for none."""
    from bench.compare.stats import percentile

    return percentile(values, q * 100) or 0.0


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def write_json(path: Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def say(message: str) -> None:
    """Print a figure or a step at once (the run's output is read as it comes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Deadline:
    """Seconds left before a phase must be done (an absolute time, passed between processes)."""

    def __init__(self, at: float):
        self.at = at

    def left(self) -> float:
        return self.at - time.time()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


def plan_dict(plan: Plan) -> dict:
    return asdict(plan)
