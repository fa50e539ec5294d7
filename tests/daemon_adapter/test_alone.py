"""A daemon started alone builds its process groups without peers (``daemon_adapter.alone``): of the
rank and size it is given, at once, with torch's real functions back in place afterwards; and it
refuses where its groups would not be gloo, saying what to do.

Each case runs in a fresh interpreter: torch.distributed keeps one default group per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from daemon_adapter.alone import START_ALONE_ENV, StartAloneUnsupported, groups_without_peers

RUN_TIMEOUT_S = 120.0


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def test_groups_of_the_sets_size_and_this_rank_wait_for_no_peer() -> None:
    # Rank 2 of 4 at a rendezvous where nobody listens: a real gloo group would wait there.
    done = _run(
        """
        import torch.distributed as dist
        from daemon_adapter.alone import groups_without_peers
        real = dist.new_group
        with groups_without_peers("gloo"):
            dist.init_process_group(backend="gloo", init_method="tcp://127.0.0.1:9", world_size=4, rank=2)
            group = dist.new_group([2, 3], backend="gloo")
        assert dist.new_group is real, "torch's new_group was not put back"
        print(dist.get_rank(), dist.get_world_size(), dist.get_rank(group), dist.get_world_size(group))
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["2", "4", "0", "2"], done.stdout


def test_without_the_scope_the_same_start_waits_for_its_peers() -> None:
    # The rule broken: without groups_without_peers, rank 2 of 4 waits at the rendezvous until its timeout.
    done = _run(
        """
        import datetime
        import torch.distributed as dist
        try:
            dist.init_process_group(
                backend="gloo", init_method="tcp://127.0.0.1:9", world_size=4, rank=2,
                timeout=datetime.timedelta(seconds=3),
            )
        except Exception as error:
            print("waited:", type(error).__name__)
        """
    )
    assert "waited:" in done.stdout, (done.stdout, done.stderr[-2000:])


def test_a_platform_whose_groups_are_not_gloo_is_refused_with_what_to_do() -> None:
    with pytest.raises(StartAloneUnsupported) as refused, groups_without_peers("nccl"):
        pass
    message = str(refused.value)
    assert START_ALONE_ENV in message and "'nccl'" in message and "Start every daemon of the set again" in message
