"""A reload's progress, as ``expert-layout status`` shows it while a repair runs: ``read_tensors``
counts what it will read from the files' headers before it reads any tensor, then each tensor it
hands to sglang's loader; the status table prints both. Real safetensors files, no model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from daemon_adapter.repair import RepairProgress, read_tensors
from daemon_adapter.status_cli import ANSWERED, DaemonStatus, render_table


def test_progress_knows_what_it_will_read_before_the_first_tensor(tmp_path: Path) -> None:
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"keep.0": torch.zeros(4, 8), "skip.0": torch.zeros(100)}, str(first))
    save_file({"keep.1": torch.zeros(3, dtype=torch.bfloat16), "skip.1": torch.zeros(7)}, str(second))
    progress = RepairProgress()
    reading = read_tensors([str(first), str(second)], lambda name: name.startswith("keep."), progress)

    name, tensor = next(reading)
    # Expected from the headers alone (4*8 float32 + 3 bfloat16), though one tensor is read so far.
    assert (progress.tensors_expected, progress.bytes_expected) == (2, 4 * 8 * 4 + 3 * 2)
    assert (name, progress.tensors, progress.bytes) == ("keep.0", 1, tensor.nbytes)
    rest = list(reading)
    assert [n for n, _ in rest] == ["keep.1"]
    assert (progress.tensors, progress.bytes, progress.files) == (2, progress.bytes_expected, 2)


def test_status_shows_a_running_repair_with_its_progress() -> None:
    state = {
        "phase": "repairing",
        "version": 3,
        "digest": "ab" * 32,
        "attached": [],
        "repairing": {"engine_id": "E", "layers": [0, 2], "base_version": 3},
        "repair_progress": {"tensors": 3, "tensors_expected": 6, "bytes": 1024, "bytes_expected": 2048},
    }
    table = render_table([DaemonStatus("/run/d0.sock", ANSWERED, state=state)])
    assert "reloading layers [0, 2] back to v3 (3/6 tensors, 1024/2048 bytes read)" in table, table
    done = dict(state, repair_progress=None)
    assert "tensors" not in render_table([DaemonStatus("/run/d0.sock", ANSWERED, state=done)])
