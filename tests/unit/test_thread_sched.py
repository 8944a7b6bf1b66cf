"""bench/thread_sched.py reads per-thread scheduler figures from /proc (Linux; no Ray)."""

import os
import threading
import time

from bench import thread_sched


def test_a_spinning_thread_shows_on_a_cpu_and_a_sleeping_one_does_not():
    spinning = threading.Event()
    stop = threading.Event()

    def spin():
        spinning.set()
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    spinning.wait()
    try:
        counters = thread_sched.thread_counters(os.getpid())
        assert worker.native_id in counters and threading.get_native_id() in counters
        before = counters[worker.native_id]
        time.sleep(0.3)
        after = thread_sched.thread_counters(os.getpid())[worker.native_id]
    finally:
        stop.set()
        worker.join()
    on_cpu_ns, waiting_ns = after[0] - before[0], after[1] - before[1]
    # 0.3 s passed: the spinning thread was on a CPU or waiting for one nearly all of it.
    assert on_cpu_ns + waiting_ns > 0.2e9
    assert on_cpu_ns > 0.05e9


def test_matching_finds_this_process_by_its_command_line():
    with open("/proc/self/cmdline", "rb") as f:
        own = f.read().replace(b"\0", b" ").decode().strip()
    found = thread_sched.matching(own)
    assert found.get(os.getpid()) == own
