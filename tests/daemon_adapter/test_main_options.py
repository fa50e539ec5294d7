"""``python -m daemon_adapter``'s own option: ``--expert-layout-no-auto-repair`` turns auto repair off
for every daemon it starts (through the environment, which spawned daemons inherit), and sglang's
parsers never see it."""

from __future__ import annotations

import pytest

from daemon_adapter.__main__ import NO_AUTO_REPAIR, take_own_options
from daemon_adapter.daemon import AUTO_REPAIR_ENV, auto_repair_enabled


def test_the_flag_turns_auto_repair_off_and_is_taken_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTO_REPAIR_ENV, "1")  # recorded, so that the variable the flag sets is undone
    monkeypatch.delenv(AUTO_REPAIR_ENV)
    assert auto_repair_enabled()  # the default
    argv = ["--model-path", "m", NO_AUTO_REPAIR, "--enable-eplb"]
    assert take_own_options(argv) == ["--model-path", "m", "--enable-eplb"]
    assert not auto_repair_enabled()


def test_without_the_flag_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTO_REPAIR_ENV, "1")  # recorded, so that the variable the flag sets is undone
    monkeypatch.delenv(AUTO_REPAIR_ENV)
    argv = ["--model-path", "m", "--", NO_AUTO_REPAIR]  # after "--" it is not ours
    assert take_own_options(argv) == argv and auto_repair_enabled()
    for off in ("0", "false", "off"):
        monkeypatch.setenv(AUTO_REPAIR_ENV, off)
        assert not auto_repair_enabled()
