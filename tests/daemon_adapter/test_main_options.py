"""``python -m daemon_adapter``'s own options: ``--expert-layout-no-auto-repair`` turns auto repair off
and ``--expert-layout-start-alone`` has the daemons start without their set, ``--expert-layout-copy-dir``
and ``--expert-layout-no-copy`` place or turn off the durable copies, for every daemon it
starts (through the environment, which spawned daemons inherit), and sglang's parsers never see them."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon_adapter.__main__ import COPY_DIR, NO_AUTO_REPAIR, NO_COPY, START_ALONE, take_own_options
from daemon_adapter.alone import START_ALONE_ENV, start_alone_enabled
from daemon_adapter.daemon import AUTO_REPAIR_ENV, auto_repair_enabled
from daemon_adapter.durable import COPY_DIR_ENV, COPY_ENV, copy_enabled, copy_path


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


def test_start_alone_is_taken_out_and_reaches_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both recorded, so that the variables the flags set are undone: a leaked AUTO_REPAIR_ENV=0 turns
    # auto repair off in every daemon the later tests of this process start.
    for env in (START_ALONE_ENV, AUTO_REPAIR_ENV):
        monkeypatch.setenv(env, "0")
        monkeypatch.delenv(env)
    assert not start_alone_enabled()  # the default
    assert take_own_options(["--model-path", "m", "--", START_ALONE]) == ["--model-path", "m", "--", START_ALONE]
    assert not start_alone_enabled()
    argv = [START_ALONE, "--model-path", "m", NO_AUTO_REPAIR]
    assert take_own_options(argv) == ["--model-path", "m"]
    assert start_alone_enabled()


def test_the_copy_options_reach_the_environment_and_are_taken_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for env in (COPY_ENV, COPY_DIR_ENV):
        monkeypatch.setenv(env, "x")  # recorded, so that the variables the flags set are undone
        monkeypatch.delenv(env)
    assert copy_enabled() and copy_path("/run/d/s.sock") == Path("/run/d/expert-layout/s.sock.layout.json")
    assert take_own_options(["--model-path", "m", COPY_DIR, "copies", "--enable-eplb"]) == [
        "--model-path",
        "m",
        "--enable-eplb",
    ]
    assert copy_path("/run/d/s.sock") == Path.cwd() / "copies" / "s.sock.layout.json"
    assert take_own_options([f"{COPY_DIR}=/var/lib/x", NO_COPY, "--model-path", "m"]) == ["--model-path", "m"]
    assert not copy_enabled() and copy_path("/run/d/s.sock") is None


def test_a_copy_folder_left_out_is_a_usage_error_that_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        take_own_options(["--model-path", "m", COPY_DIR, "--enable-eplb"])
    assert exited.value.code == 2
    assert f"{COPY_DIR} needs a folder" in capsys.readouterr().err
