"""Checks SANY/TLC would make and the PyPI parser does not: names defined before use, and every
action saying what happens to every variable.

Why: TLC is not runnable in CI; these catch the two mistakes a syntax gate lets through and that
would only show at review ("Unknown operator", "successor state is not completely specified").
"""

from __future__ import annotations

import re
from pathlib import Path

from tools.mirror.system import EVENTS, VARIABLES

SPEC = Path(__file__).resolve().parents[2] / "spec"
TEXT = (SPEC / "LayoutProtocol.tla").read_text()
BUILTIN = {"TRUE", "FALSE", "BOOLEAN", "CASE", "OTHER", "IF", "THEN", "ELSE", "LET", "IN", "EXCEPT",
           "UNCHANGED", "SUBSET", "UNION", "DOMAIN", "CHOOSE", "ENABLED", "WF_vars", "SF_vars", "Nat",
           "Int", "Seq", "Len", "Append", "Head", "Tail", "Cardinality", "IsFiniteSet", "Print", "Assert",
           "Permutations", "ASSUME", "EXTENDS", "CONSTANTS", "VARIABLES", "MODULE", "NONE"}  # fmt: skip


def _strip_comments(text: str) -> str:
    text = re.sub(r"\(\*.*?\*\)", lambda m: " " * len(m.group(0)), text, flags=re.S)
    text = re.sub(r"\\\*[^\n]*", "", text)
    return re.sub(r'"[^"\n]*"', '""', text)


CODE = _strip_comments(TEXT)
DEFS = list(re.finditer(r"^([A-Za-z][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*==", CODE, re.M))


def _bodies() -> list[tuple[str, tuple[str, ...], str]]:
    out = []
    for i, m in enumerate(DEFS):
        end = DEFS[i + 1].start() if i + 1 < len(DEFS) else len(CODE)
        params = tuple(p.strip() for p in m.group(2)[1:-1].split(",")) if m.group(2) else ()
        out.append((m.group(1), params, CODE[m.end() : end]))
    return out


def _declared() -> set[str]:
    names = set()
    for block in re.findall(r"^(?:CONSTANTS|VARIABLES)\n(.*?)\n\n", CODE, re.M | re.S):
        names |= set(re.findall(r"^\s*(\w+)", block, re.M))
    return names


def test_every_name_is_defined_before_use() -> None:
    known = set(BUILTIN) | _declared()
    problems = []
    for name, params, body in _bodies():
        bound = set(params) | set(re.findall(r"(\w+)\s*\\in\b", body))  # binders and x \in S tests
        bound |= set(re.findall(r"(\w+)\s*,\s*\w+\s*\\in\b", body))  # \A r, q \in S
        bound |= set(re.findall(r"(\w+)\s*==", body))  # LET definitions
        bound |= set(re.findall(r"(\w+)\s*\|->", body)) | set(re.findall(r"!\.(\w+)", body))
        bound |= set(re.findall(r"\.(\w+)", body)) | set(re.findall(r"(\w+)\s*:", body))
        for ident in re.findall(r"(?<![\w.!\\])([A-Za-z][A-Za-z0-9_]*)", body):
            if ident in known or ident in bound or ident == name:
                continue
            problems.append(f"{name} uses {ident} before it is defined")
        known.add(name)
    assert not problems, "\n".join(sorted(set(problems)))


def _expand(body: str, bodies: dict[str, str], depth: int = 0) -> str:
    if depth > 3:
        return body
    out = body
    for helper in ("Forget", "TakeBegin", "StartFrom", "daemonVars", "engineVars"):
        if re.search(rf"\b{helper}\b", out) and helper in bodies:
            out += "\n" + _expand(bodies[helper], bodies, depth + 1)
    return out


def test_every_action_specifies_every_variable() -> None:
    bodies = {name: body for name, _, body in _bodies()}
    for action in EVENTS:
        text = _expand(bodies[action], bodies)
        missing = [
            v
            for v in VARIABLES
            if not re.search(rf"\b{v}'", text) and not re.search(rf"UNCHANGED[^\n]*\b{v}\b|<<[^>]*\b{v}\b[^>]*>>", text)
        ]
        assert not missing, f"{action} says nothing about {missing}"
