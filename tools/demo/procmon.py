"""Wall time and peak memory of a run: the memory of this process and all its descendants.

The demo's limits (10 minutes, 16 GB on 2 cores) are measured, not assumed: a thread samples
the process tree every ``interval`` seconds with psutil and keeps the peaks. Servers started with
``python -m sglang.launch_server`` and the weight cache daemons they spawn (or that the demo
starts with ``python -m daemon_adapter``) are all descendants of the demo process, so the sums
cover every process the demo is responsible for. Two sums are kept:

* PSS (proportional set size, the kernel's ``smaps_rollup``): each shared page is divided among
  the processes that map it, so the sum is the physical memory the tree takes. The limit is
  judged on this one.
* RSS: each shared page (torch's libraries, the daemons' weights mapped by the engines) counted in
  every process that maps it; an upper bound, reported beside it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


def _tree(root_pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_bytes(root_pid: int) -> tuple[int, int]:
    """(sum of RSS over ``root_pid`` and its descendants, number of processes)."""
    rss, _, count = tree_memory_bytes(root_pid, pss=False)
    return rss, count


def tree_memory_bytes(root_pid: int, pss: bool = True) -> tuple[int, int, int]:
    """(sum of RSS, sum of PSS, number of processes) over ``root_pid`` and its descendants;
    PSS is 0 with ``pss=False`` (reading it costs a walk of each process's mappings)."""
    rss = pss_total = count = 0
    for proc in _tree(root_pid):
        try:
            if pss:
                full = proc.memory_full_info()
                rss, pss_total = rss + full.rss, pss_total + full.pss
            else:
                rss += proc.memory_info().rss
            count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # exited between the listing and the read
    return rss, pss_total, count


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass
class ResourceMeter:
    """Samples the process tree of ``root_pid`` in a background thread until ``stop``."""

    root_pid: int = field(default_factory=os.getpid)
    interval: float = 0.5
    peak_bytes: int = 0  # RSS sum
    peak_pss_bytes: int = 0
    peak_pss_at_s: float = 0.0
    peak_processes: int = 0
    peak_at_s: float = 0.0
    samples: int = 0
    started: float = field(default_factory=time.monotonic)
    stopped: float | None = None
    # the whole machine's busy CPU seconds (the tree's processes come and go; on a machine that
    # runs nothing else this is the demo's CPU): how far from CPU-bound the run was
    cpu_busy_start: float = field(default_factory=_machine_busy_s)
    cpu_busy_s: float = 0.0
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ResourceMeter:
        self._thread = threading.Thread(target=self._run, name="resource-meter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> None:
        rss, pss, count = tree_memory_bytes(self.root_pid)
        self.samples += 1
        now = time.monotonic() - self.started
        if rss > self.peak_bytes:
            self.peak_bytes, self.peak_at_s = rss, now
        if pss > self.peak_pss_bytes:
            self.peak_pss_bytes, self.peak_pss_at_s = pss, now
        self.peak_processes = max(self.peak_processes, count)

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        self.stopped = time.monotonic()
        self.cpu_busy_s = _machine_busy_s() - self.cpu_busy_start

    @property
    def seconds(self) -> float:
        return (self.stopped or time.monotonic()) - self.started

    def to_json(self) -> dict[str, float | int]:
        return {
            "wall_s": round(self.seconds, 1),
            "peak_pss_gb": round(self.peak_pss_bytes / 2**30, 2),
            "peak_pss_at_s": round(self.peak_pss_at_s, 1),
            "peak_rss_gb": round(self.peak_bytes / 2**30, 2),
            "peak_rss_at_s": round(self.peak_at_s, 1),
            "peak_processes": self.peak_processes,
            "samples": self.samples,
            "interval_s": self.interval,
            "cpu_busy_s": round(self.cpu_busy_s, 1),
            "cpu_use": round(self.cpu_busy_s / (self.seconds * (os.cpu_count() or 1)), 2) if self.seconds else 0.0,
        }
