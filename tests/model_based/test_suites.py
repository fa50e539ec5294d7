"""Where the suites come from: TLC's graphs in ../shared/tlc/, checked against spec/; TLC's variable order.

The variable-order fixtures are TLC's real output (`fixtures/tlc-samples/README.md`): 40 variables
printed by TLC from a module that declares them (`VarOrderBase`) and from one that EXTENDS it
(`VarOrderRoot`, as the spec's models extend `LayoutProtocol`).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from tools.mirror.dot import load_dot
from tools.mirror.render import fit_variable_order, java_string_hash, sany_variable_order

from tests.model_based import suites

SAMPLES = Path(__file__).parent / "fixtures" / "tlc-samples"


def test_java_string_hash() -> None:
    # values of Java's "...".hashCode()
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("dphase") == -1325422697
    assert java_string_hash("polygenelubricants") == -2147483648


@pytest.mark.parametrize(
    ("module", "table"),
    [("VarOrderBase", (191, 191)), ("VarOrderRoot", (383, 191))],
)
def test_sany_variable_order_is_tlcs(module: str, table: tuple[int, int]) -> None:
    sample = json.loads((SAMPLES / "variable_order.json").read_text())
    declared, printed = sample["declared"], sample[module]
    assert printed != declared
    assert fit_variable_order(declared, printed) == table
    assert sany_variable_order(declared, *table) == tuple(printed)
    # the variables that share a bucket are what `inserted_at` decides: the extending module's
    # variables entered a smaller table than the one they end in
    if table[0] != table[1]:
        assert sany_variable_order(declared, table[0]) != tuple(printed)


def test_toy_sample_order() -> None:
    graph = load_dot(SAMPLES / "toy_full_graph.dot")
    printed = suites.printed_variable_order(graph, "toy")
    assert printed == ("attached", "rec", "log")  # declared: rec, attached, log
    assert fit_variable_order(("rec", "attached", "log"), printed) is not None


def _tlc_dir(tmp_path: Path, model: str, hashes: dict[str, str]) -> Path:
    where = tmp_path / "tlc"
    where.mkdir()
    rows = "\n".join(f"| {f} | {h} |" for f, h in hashes.items())
    (where / "README.md").write_text(f"| file | SHA-256 |\n| --- | --- |\n{rows}\n")
    with gzip.open(where / f"{model}.dot.gz", "wt") as f:
        f.write((SAMPLES / "toy_full_graph.dot").read_text())
    return where


def test_a_graph_of_another_spec_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashes = suites.spec_hashes("MCSmall")
    other = {**hashes, "LayoutProtocol.tla": "0" * 64}
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(_tlc_dir(tmp_path, "MCSmall", other)))
    with pytest.raises(suites.StaleGraph, match=r"another spec than spec/(.|\n)*LayoutProtocol.tla: TLC ran on 0000"):
        suites.build("MCSmall")


def test_a_missing_graph_or_unstated_spec_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(tmp_path))
    with pytest.raises(suites.StaleGraph, match="no TLC graph of MCSmall"):
        suites.build("MCSmall")
    where = _tlc_dir(tmp_path, "MCSmall", suites.spec_hashes("MCSmall"))
    (where / "README.md").unlink()
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(where))
    with pytest.raises(suites.StaleGraph, match="states no SHA-256"):
        suites.build("MCSmall")


def test_a_current_graph_is_read_from_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = _tlc_dir(tmp_path, "MCSmall", suites.spec_hashes("MCSmall"))
    shutil.copy(SAMPLES / "toy_full_stdout.txt", where / "MCSmall.stdout.txt")
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(where))
    suite = suites.build("MCSmall")
    m = suite.manifest
    assert m["source"] == "tlc" and m["dot"] == "MCSmall.dot.gz"
    assert re.fullmatch(r"[0-9a-f]{64}", m["dot_sha256"])
    assert m["tlc_version"] != "unknown"
    assert m["variable_order"] == ["attached", "rec", "log"]
    assert m["edges_covered"] == m["graph_edges"] > 0
