"""The rendezvous of the daemons sglang's engine spawns across nodes (``--weight-cache-mode daemon``):
never the engines' own ``--dist-init-addr``, the same on every node. The real servers across two nodes
are in tests/realserver/test_two_nodes.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from daemon_adapter.hooks import DAEMON_PORT_ENV, daemons_rendezvous


def _args(nnodes: int, addr: str | None = "10.0.0.1:5000") -> SimpleNamespace:
    return SimpleNamespace(nnodes=nnodes, dist_init_addr=addr)  # the two ServerArgs fields it reads


def test_across_nodes_the_daemons_leave_the_engines_port_for_the_one_below(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DAEMON_PORT_ENV, raising=False)
    assert daemons_rendezvous(_args(2), "tcp://10.0.0.1:5000") == "tcp://10.0.0.1:4999"


def test_the_operator_chooses_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DAEMON_PORT_ENV, "6100")
    assert daemons_rendezvous(_args(4), "tcp://10.0.0.1:5000") == "tcp://10.0.0.1:6100"


@pytest.mark.parametrize("bad", ["x", "5000", "0", "70000"])
def test_a_port_that_cannot_work_says_what_to_set(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(DAEMON_PORT_ENV, bad)
    with pytest.raises(ValueError, match=DAEMON_PORT_ENV):
        daemons_rendezvous(_args(2), "tcp://10.0.0.1:5000")


def test_sglangs_own_choice_stands_on_one_node_or_at_another_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DAEMON_PORT_ENV, "6100")
    assert daemons_rendezvous(_args(1), "tcp://10.0.0.1:5000") == "tcp://10.0.0.1:5000"
    assert daemons_rendezvous(_args(2, None), "tcp://127.0.0.1:7000") == "tcp://127.0.0.1:7000"
    assert daemons_rendezvous(_args(2), "tcp://127.0.0.1:7000") == "tcp://127.0.0.1:7000"
