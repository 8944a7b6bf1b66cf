"""Load shapes, chosen with `--shape` (env LOCUST_SHAPE).

Every scenario file imports `SelectedShape`, the one concrete `LoadTestShape`
Locust sees; it builds the shape named by `--shape` on its first tick:

  none           -u/-r/-t as usual (the default for the scenario files)
  stress_matrix  payload 1 and 16 records x pacing 0.5 s, 0.1 s, 0.01 s per user;
                 needs -f locustfiles/stress_matrix.py (the default shape there)
  step_ramp      add --ramp-step-users every --ramp-step-seconds up to --ramp-max-users
  burst          --burst-quiet-users, then --burst-users, then quiet again

The three shapes are `abstract` LoadTestShape subclasses (so Locust does not
pick them up on its own) with a pure `at(run_time)` that the unit tests call.
Every numeric knob is a command-line flag with an env var, so the same image
works on a laptop and in Kubernetes (distributed: the shape runs on the master).
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

from locust import LoadTestShape, events

log = logging.getLogger("serve_app.load")

SHAPES = ("none", "stress_matrix", "step_ramp", "burst")

#: (records per request, seconds between one user's request starts)
MATRIX_CELLS: tuple[tuple[int, float], ...] = (
    (1, 0.5), (1, 0.1), (1, 0.01),
    (16, 0.5), (16, 0.1), (16, 0.01),
)


def cell_tag(records: int, pacing: float) -> str:
    """`16rec @0.10s`: the request-name suffix (per-cell stats rows) of one matrix cell."""
    return f"{records}rec @{pacing:.2f}s"


def cell_class_name(records: int, pacing: float) -> str:
    return f"Cell{records:02d}rec{int(round(pacing * 1000)):04d}ms"


@events.init_command_line_parser.add_listener
def _add_arguments(parser, **_kw):
    a = parser.add_argument
    a("--shape", choices=SHAPES, default=None, env_var="LOCUST_SHAPE",
      help="Load shape: none (-u/-r/-t), stress_matrix, step_ramp, burst. "
           "Default: stress_matrix for stress_matrix.py, else none.")
    a("--matrix-users", type=int, default=10, env_var="LOCUST_MATRIX_USERS",
      help="stress_matrix: users per cell (offered rate = users / pacing). Default %(default)s.")
    a("--cell-seconds", type=float, default=30, env_var="LOCUST_CELL_SECONDS",
      help="stress_matrix: seconds each cell runs. Default %(default)s.")
    a("--cell-gap-seconds", type=float, default=5, env_var="LOCUST_CELL_GAP_SECONDS",
      help="stress_matrix: seconds with no users between cells, so queues drain. Default %(default)s.")
    a("--ramp-start-users", type=int, default=1, env_var="LOCUST_RAMP_START_USERS",
      help="step_ramp: users in the first step. Default %(default)s.")
    a("--ramp-step-users", type=int, default=2, env_var="LOCUST_RAMP_STEP_USERS",
      help="step_ramp: users added each step. Default %(default)s.")
    a("--ramp-step-seconds", type=float, default=20, env_var="LOCUST_RAMP_STEP_SECONDS",
      help="step_ramp: seconds per step. Default %(default)s.")
    a("--ramp-max-users", type=int, default=21, env_var="LOCUST_RAMP_MAX_USERS",
      help="step_ramp: stop after the step that reaches this many users. Default %(default)s.")
    a("--burst-quiet-users", type=int, default=1, env_var="LOCUST_BURST_QUIET_USERS",
      help="burst: users before and after the burst. Default %(default)s.")
    a("--burst-users", type=int, default=30, env_var="LOCUST_BURST_USERS",
      help="burst: users during the burst. Default %(default)s.")
    a("--burst-quiet-seconds", type=float, default=30, env_var="LOCUST_BURST_QUIET_SECONDS",
      help="burst: quiet seconds before the burst. Default %(default)s.")
    a("--burst-seconds", type=float, default=90, env_var="LOCUST_BURST_SECONDS",
      help="burst: seconds of the burst (long enough for upscale_delay_s). Default %(default)s.")
    a("--burst-cooldown-seconds", type=float, default=120, env_var="LOCUST_BURST_COOLDOWN_SECONDS",
      help="burst: quiet seconds after it (long enough for downscale_delay_s). Default %(default)s.")


Tick = Optional[tuple]


class StressMatrix(LoadTestShape):
    """Each cell in turn: `users` users of that cell's user class for `cell_seconds`,
    then `gap_seconds` with none. Per-cell stats come from the request names
    (`/translation 16rec @0.10s`, plus `... [shed]` rows)."""

    abstract = True

    def __init__(self, users: int = 10, cell_seconds: float = 30, gap_seconds: float = 5,
                 cells: Sequence[tuple[int, float]] = MATRIX_CELLS):
        super().__init__()
        self.users, self.cell_seconds, self.gap_seconds, self.cells = users, cell_seconds, gap_seconds, cells

    def at(self, t: float) -> Optional[tuple[int, float, Optional[tuple[int, float]]]]:
        """(users, spawn rate, cell or None during a gap) at run time `t`; None when done."""
        period = self.cell_seconds + self.gap_seconds
        index = int(t // period)
        if index >= len(self.cells):
            return None
        rate = float(max(self.users, 1) * 5)  # everyone within 0.2 s
        if t - index * period < self.cell_seconds:
            return self.users, rate, self.cells[index]
        return 0, rate, None

    def tick(self):
        step = self.at(self.get_run_time())
        return None if step is None else step[:2]


class StepRamp(LoadTestShape):
    """start, start+step, ... users, `step_seconds` each, up to `max_users` users."""

    abstract = True

    def __init__(self, start_users: int = 1, step_users: int = 2, step_seconds: float = 20, max_users: int = 21):
        super().__init__()
        self.start_users, self.step_users = start_users, step_users
        self.step_seconds, self.max_users = step_seconds, max_users

    def steps(self) -> int:
        if self.step_users <= 0:
            return 1
        return max(1, math.floor((self.max_users - self.start_users) / self.step_users) + 1)

    def at(self, t: float) -> Tick:
        index = int(t // self.step_seconds)
        if index >= self.steps():
            return None
        return self.start_users + index * self.step_users, float(max(self.step_users, 1) * 2)

    def tick(self):
        return self.at(self.get_run_time())


class Burst(LoadTestShape):
    """quiet -> sudden high -> quiet: long enough phases for Serve's autoscaler to
    scale up during the burst (upscale_delay_s) and back down after (downscale_delay_s)."""

    abstract = True

    def __init__(self, quiet_users: int = 1, burst_users: int = 30, quiet_seconds: float = 30,
                 burst_seconds: float = 90, cooldown_seconds: float = 120):
        super().__init__()
        self.quiet_users, self.burst_users = quiet_users, burst_users
        self.quiet_seconds, self.burst_seconds, self.cooldown_seconds = quiet_seconds, burst_seconds, cooldown_seconds

    def at(self, t: float) -> Tick:
        fast = float(max(self.burst_users, 1) * 10)  # "sudden": the whole burst within 0.1 s
        if t < self.quiet_seconds:
            return self.quiet_users, fast
        if t < self.quiet_seconds + self.burst_seconds:
            return self.burst_users, fast
        if t < self.quiet_seconds + self.burst_seconds + self.cooldown_seconds:
            return self.quiet_users, fast
        return None

    def tick(self):
        return self.at(self.get_run_time())


class SelectedShape(LoadTestShape):
    """The shape named by --shape (see the module docstring)."""

    use_common_options = True  # `--shape none` honours -u, -r and -t

    def __init__(self):
        super().__init__()
        self._delegate: Optional[LoadTestShape] = None
        self._name: Optional[str] = None
        self._matrix_classes: dict[tuple[int, float], type] = {}

    def reset_time(self):
        super().reset_time()
        self._name = None  # rebuilt from the current options on the next tick

    def _build(self) -> None:
        env = self.runner.environment
        o = env.parsed_options
        available = env.available_user_classes or {}
        name = o.shape
        matrix_names = {cell_class_name(r, p): (r, p) for r, p in MATRIX_CELLS}
        if name is None:
            name = "stress_matrix" if available and set(available) <= set(matrix_names) else "none"
        self._name = name
        if name == "stress_matrix":
            missing = sorted(set(matrix_names) - set(available))
            if missing:
                raise RuntimeError(f"--shape stress_matrix needs -f locustfiles/stress_matrix.py "
                                   f"(user classes {', '.join(missing)} are not loaded)")
            self._matrix_classes = {matrix_names[n]: available[n] for n in matrix_names}
            self._delegate = StressMatrix(o.matrix_users, o.cell_seconds, o.cell_gap_seconds)
        elif name == "step_ramp":
            self._delegate = StepRamp(o.ramp_start_users, o.ramp_step_users, o.ramp_step_seconds, o.ramp_max_users)
        elif name == "burst":
            self._delegate = Burst(o.burst_quiet_users, o.burst_users, o.burst_quiet_seconds,
                                   o.burst_seconds, o.burst_cooldown_seconds)
        else:
            self._delegate = None
        self._scenario_classes = [c for n, c in available.items() if n not in matrix_names] or None
        log.info("load shape: %s", name)

    def tick(self):
        if self._name is None:
            self._build()
        t = self.get_run_time()
        o = self.runner.environment.parsed_options
        # Headless Locust joins the shape before it arms -t, so the shape enforces -t
        # itself: a cap for every shape, the only end for `none`.
        if o.run_time and t >= o.run_time:
            return None
        if self._name == "none":
            return o.num_users or 1, o.spawn_rate or 1
        if isinstance(self._delegate, StressMatrix):
            step = self._delegate.at(t)
            if step is None:
                return None
            users, rate, cell = step
            if cell is None:  # gap: keep the class list of the previous cell, with no users
                return 0, rate
            return users, rate, [self._matrix_classes[cell]]
        step = self._delegate.at(t)
        if step is None:
            return None
        return step[0], step[1], self._scenario_classes
