"""The real demo's own parts that need no server: the memory probe's slot identification, the
results table (full cells, wrapped), the process-tree meter and the failure line a launcher shows."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from tools.demo import memory_probe, results
from tools.demo.procmon import ResourceMeter, tree_memory_bytes, tree_rss_bytes
from tools.demo.real.lab import failure_line


def _gates(num_experts: int = 8, inter: int = 4, hidden: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(inter, hidden, generator=g) for _ in range(num_experts)]


def test_identify_slots_reads_each_slot_even_with_padding() -> None:
    gates = _gates()
    placed = [3, 0, 7, 3, 5]  # a redundant copy of expert 3
    inter, hidden = gates[0].shape
    # sglang's fused w13 = [gate; up], padded after each part on CPU TP (here to 2*inter + 4 rows)
    w13 = torch.zeros(len(placed), 2 * inter + 4, hidden)
    for slot, expert in enumerate(placed):
        w13[slot, :inter] = gates[expert]
        w13[slot, inter + 2 : 2 * inter + 2] = torch.randn(inter, hidden)
    assert memory_probe.identify_slots(w13, gates) == placed


def test_identify_slots_says_unknown_for_weights_of_no_expert() -> None:
    gates = _gates()
    w13 = torch.zeros(2, 8, 6)
    w13[0, :4] = gates[1]
    w13[1, :4] = gates[2] + 0.5  # no expert's weights
    assert memory_probe.identify_slots(w13, gates) == [1, memory_probe.UNKNOWN]


def test_wrong_slots_and_sglang_initial_layout() -> None:
    trivial = memory_probe.trivial_map(2, 10, 8)
    assert trivial[0] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    held = [row[:] for row in trivial]
    held[1][3], held[1][4] = held[1][4], held[1][3]
    assert memory_probe.wrong_slots(trivial, held) == 2
    assert memory_probe.wrong_slots(trivial, trivial) == 0


def test_text_table_keeps_every_cell_whole() -> None:
    res = results.Results()
    observed = " ".join(f"word{i}" for i in range(60))
    res.add(results.Row("3b", "SIGKILL mid-move " * 4, "x", observed, {"reason": "dirty " * 20}, True))
    table = results.text_table(res)
    assert "…" not in table
    words = table.split()
    for i in range(60):
        assert f"word{i}" in words, f"word{i} was cut from the table:\n{table}"
    assert max(len(line) for line in table.splitlines()) <= 4 + 18 + 30 + 60 + 44 + 8


def test_text_table_never_wraps_a_case_name() -> None:
    res = results.Results()
    res.add(results.Row("limits", "time and memory", "x", "600 s", {"wall_s": 1}, True, judged=False))
    table = results.text_table(res)
    assert any(line.split()[:2] == ["limits", "within"] for line in table.splitlines() if line.strip()), table


def test_a_limit_missed_is_a_warning_and_the_run_time_is_the_runs() -> None:
    res = results.Results()
    res.started -= 42.0  # the run began 42 s ago
    res.add(results.Row("1", "restart", "adopts", "adopted", {}, True))
    res.add(results.Row("limits", "time and memory", "600 s", "713 s wall", {"wall_s": 713}, False, judged=False))
    assert res.all_passed and [r.case for r in res.limits_exceeded] == ["limits"]
    assert "exceeded (warning)" in results.text_table(res)
    assert res.to_json()["seconds"] >= 42.0
    res.add(results.Row("3b", "mid-move", "fails", "served", {}, False))
    assert not res.all_passed


def test_meter_sees_a_child_process_memory() -> None:
    before, _ = tree_rss_bytes(os.getpid())
    _, pss_before, _ = tree_memory_bytes(os.getpid())
    meter = ResourceMeter(interval=0.05).start()
    # A child that holds ~200 MB for a moment: the tree's peak must include it.
    code = "b = bytearray(200 * 2**20); import time; time.sleep(1.0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    time.sleep(0.1)
    meter.stop()
    assert meter.peak_bytes >= before + 150 * 2**20
    assert meter.peak_pss_bytes >= pss_before + 150 * 2**20  # the child's pages are its own
    assert meter.peak_processes >= 2
    assert meter.to_json()["wall_s"] >= 1.0


def test_failure_line_prefers_the_protocol_reason_over_noise() -> None:
    log = "\n".join(
        [
            "[2026-12-01 10:30:11] Pyspy failed (py-spy dump --pid 1). Error: /bin/sh: 1: py-spy: not found",
            "[2026-12-01 10:30:11 TP0 EP0] [expert-layout] rank 0 startup: keep_own (daemons at version 0)",
            "[2026-12-01 10:30:12 TP0 EP0] [expert-layout] every rank fails: rank 0: daemon dirty: engine e left",
            "RuntimeError: scheduler died",
        ]
    )
    assert "daemon dirty" in failure_line(log)
    assert failure_line("x\nRuntimeError: shape mismatch\n") == "RuntimeError: shape mismatch"
    assert failure_line("nothing here") == ""


def test_model_families_and_the_first_familys_folder_name_is_unchanged() -> None:
    from tools.realserver import model

    # the demo's checkpoint keeps the name it always had; a second family names its own folder
    assert model.TinyMoeRecipe().digest() == "1f0784b8cd52"
    qwen2 = model.TinyMoeRecipe(family="qwen2_moe")
    assert qwen2.digest() != model.TinyMoeRecipe().digest()
    config = model._config(qwen2)
    assert type(config).__name__ == "Qwen2MoeConfig" and config.shared_expert_intermediate_size == 48
    assert type(model._config(model.TinyMoeRecipe())).__name__ == "Qwen3MoeConfig"
    with pytest.raises(ValueError, match="unknown MoE family 'mixtral'"):
        model._config(model.TinyMoeRecipe(family="mixtral"))


def test_the_demo_shows_the_plugins_series_per_rank_and_reason() -> None:
    from tools.demo.real.lab import _metric_summary

    samples = [
        ("sglang:expert_layout_record_version", {"tp_rank": "0", "pid": "7"}, 6.0),
        ("sglang:expert_layout_record_version", {"tp_rank": "1", "pid": "8"}, 6.0),
        ("sglang:expert_layout_chunks_committed_total", {"tp_rank": "0"}, 2.0),
        ("sglang:expert_layout_rebalances_paused_total", {"tp_rank": "0", "reason": "other_engine_attached"}, 1.0),
        ("sglang:expert_layout_rebalances_paused_total", {"tp_rank": "0", "reason": "other_engine_attached"}, 1.0),
        ("sglang:other_series", {"tp_rank": "0"}, 99.0),
    ]
    assert _metric_summary(samples) == [
        "version rank 0=6, rank 1=6",
        "chunks committed rank 0=2",
        "paused rank 0 other_engine_attached=2",
    ]


def test_a_slow_takeover_is_a_warning_and_a_wrong_one_a_failure() -> None:
    """2b is judged on what the protocol decides; its time is a limit row (a warning, never a failure)."""
    from tools.demo.real.cases import TakeoverSeen, takeover_rows

    layout, out = [[0, 1], [1, 0]], [[5, 6]]

    def judged(first_token_s: float, c_map: list[list[int]], ready_s: float | None = 0.3) -> results.Results:
        seen = TakeoverSeen(first_token_s, first_token_s + 1, ready_s, 200, [3, 3], 3, True, c_map, out, {})
        res = results.Results()
        for row in takeover_rows(seen, layout, out, cold_s=20.0):
            res.add(row)
        return res

    assert judged(0.4, layout).all_passed and not judged(0.4, layout).limits_exceeded
    slow = judged(1.6, layout)
    assert slow.all_passed and [r.case for r in slow.limits_exceeded] == ["2b time"]
    for ready_s in (1.6, None):  # /ready 200 late, or never: the same limit
        late = judged(0.4, layout, ready_s)
        assert late.all_passed and [r.case for r in late.limits_exceeded] == ["2b time"]
    assert not judged(0.4, [[1, 0], [0, 1]]).all_passed  # another map than the record's fails 2b


def test_the_quiet_gate_waits_for_work_and_holds_new_work_back() -> None:
    """A takeover's timing (quiet) starts once no start or generation is under way in the other lane,
    and no new one begins until it is done."""
    import threading

    from tools.demo.real.lab import QuietGate

    gate, events = QuietGate(), []
    busy_entered, release_busy = threading.Event(), threading.Event()

    def lane_b_work() -> None:
        with gate.busy():
            events.append("work")
            busy_entered.set()
            release_busy.wait(5)
        events.append("work done")

    def lane_a_quiet() -> None:
        with gate.quiet(timeout_s=5):
            events.append("quiet")
            time.sleep(0.2)
            events.append("quiet done")

    def lane_b_more_work() -> None:
        with gate.busy():
            events.append("more work")

    first = threading.Thread(target=lane_b_work)
    first.start()
    busy_entered.wait(5)
    quiet = threading.Thread(target=lane_a_quiet)
    quiet.start()
    time.sleep(0.1)
    assert "quiet" not in events  # it waits for the work under way
    release_busy.set()
    first.join(5)
    time.sleep(0.05)
    more = threading.Thread(target=lane_b_more_work)
    more.start()
    for thread in (quiet, more):
        thread.join(5)
    assert events.index("quiet") > events.index("work done")
    assert events.index("more work") > events.index("quiet done")  # held back until the timing is done
