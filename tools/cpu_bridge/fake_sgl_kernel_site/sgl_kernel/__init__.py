"""FakeSglKernel: an import-only stand-in for sglang's ``sgl_kernel`` kernel package (its CPU
build is not on PyPI), for the CPU test bridge only: every name imports, none may be called."""

from __future__ import annotations

from typing import Any, NoReturn


class FakeSglKernelOp:
    """A name imported from the fake ``sgl_kernel``; calling it says which kernel was needed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{self.name} was called, but this is the CPU test bridge's import-only "
            "stand-in for sgl_kernel: this code path needs the real sgl_kernel build"
        )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return FakeSglKernelOp(name)
