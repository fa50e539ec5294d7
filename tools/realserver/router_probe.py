"""A router's readiness probe of a real server, polled from outside: sglang's ``/ready``.

sglang's ``/ready`` answers at once from the tokenizer manager's flags (``is_ready``: started, healthy,
not paused), so a router with a short timeout reads it; a parked warm standby's server status stays
``Starting`` (``engine_adapter.standby_server``), so it answers 503 until the standby is promoted on
every rank. ``/health`` of an up server generates one token and looks for it only after a second's
sleep (sglang's ``health_generate``), longer than a router's usual timeout.

``ReadyPoller(url).start()`` asks ``/ready`` every ``poll_s`` (a request that outlasts the period is
followed by the next at once) with a ``timeout_s`` per request, from a thread, until ``stop()``, which
returns every answer with its wall clock (unix seconds, to compare with the marks the processes log);
``wait_ready(after, timeout_s)`` waits for the first 200 to a request sent after a moment (a SIGKILL).
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

READY_PATH = "/ready"
POLL_S = 0.05
TIMEOUT_S = 0.5


@dataclass(frozen=True)
class ProbeAnswer:
    """One ``/ready`` request: when it was sent and answered (unix s), and its status (None: no answer
    within the timeout, or the connection failed)."""

    sent: float
    answered: float
    status: int | None


class ReadyPoller:
    def __init__(self, url: str, poll_s: float = POLL_S, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url + READY_PATH
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.answers: list[ProbeAnswer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ready-poller", daemon=True)

    def start(self) -> ReadyPoller:
        self._thread.start()
        return self

    def stop(self) -> list[ProbeAnswer]:
        self._stop.set()
        self._thread.join(self.timeout_s + 5.0)
        return list(self.answers)

    def wait_ready(self, after: float, timeout_s: float) -> ProbeAnswer | None:
        """The first 200 to a request sent at or after ``after`` (unix s), once it came; None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (ready := first_ready(self.answers, after)) is None and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return ready

    def _poll(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            status = self._ask()
            self.answers.append(ProbeAnswer(sent, time.time(), status))
            self._stop.wait(max(0.0, sent + self.poll_s - time.time()))

    def _ask(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None


def first_ready(answers: list[ProbeAnswer], after: float) -> ProbeAnswer | None:
    """The first 200 among the answers to requests sent at or after ``after`` (unix s)."""
    return next((a for a in answers if a.sent >= after and a.status == 200), None)
