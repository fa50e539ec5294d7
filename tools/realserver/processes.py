"""Process trees started by the real-server library: logs to a file, SIGKILL of the whole tree,
and the memory they hold. No sglang import (the library's side of a test stays light)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil


class ProcessTree:
    """One command in its own session (process group), its output appended to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def members(self) -> list[psutil.Process]:
        """The root and every descendant still running (sglang's schedulers, daemons...)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_bytes(self) -> int:
        total = 0
        for p in self.members():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def kill(self) -> None:
        """SIGKILL the whole tree: every descendant by pid, then the process group."""
        for p in reversed(self.members()):
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def terminate(self, grace_s: float = 20.0) -> None:
        """SIGTERM the root, then SIGKILL what is left after ``grace_s``."""
        if self.alive():
            members = self.members()
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
            psutil.wait_procs(members, timeout=max(1.0, grace_s / 4))
        self.kill()

    def error_lines(self, most: int = 20, width: int = 400) -> list[str]:
        """The log's error lines (an ``ERROR`` level or an exception's last line), last ``most``."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        found = [
            line if len(line) <= width else line[:width] + " …"
            for line in text.splitlines()
            if " ERROR " in line or line.startswith(("RuntimeError", "ValueError", "Exception")) or "Error: " in line
        ]
        return found[-most:]

    def failure_report(self) -> str:
        """What a person who launched the command needs: its error lines, then the end of its log."""
        errors = "\n".join(self.error_lines()) or "(none)"
        return f"log {self.log_path}\n--- error lines:\n{errors}\n--- last lines:\n{self.log_tail()}"

    def log_tail(self, lines: int = 40, width: int = 400) -> str:
        """The end of the log, long lines cut (sglang prints its server_args on one line)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        tail = text.splitlines()[-lines:]
        return "\n".join(line if len(line) <= width else line[:width] + " …" for line in tail)
