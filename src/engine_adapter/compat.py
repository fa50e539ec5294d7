"""The versions this plugin is tested with, named in this one place, and the warning for any other.

``make setup`` installs exactly these (the Makefile's sglang pin and the Python these machines
have); ``tests/engine_adapter/test_install_check.py`` checks that the pin is listed here.
``pyproject.toml`` accepts every Python sglang does (``>=3.11``): an untested one gets the same
warning at startup as an untested sglang, and every install check stays enforced.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata

TESTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)
TESTED_PYTHON_VERSIONS: tuple[str, ...] = ("3.11",)


def installed_sglang_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:  # a source checkout on sys.path
        import sglang

        return str(getattr(sglang, "__version__", "unknown"))


def installed_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def tested_versions() -> str:
    """For messages: what the plugin was tested with."""
    return f"sglang {', '.join(TESTED_SGLANG_VERSIONS)} on Python {', '.join(TESTED_PYTHON_VERSIONS)}"


def untested_warning(sglang_version: str, python_version: str) -> str | None:
    """The startup warning for versions the plugin was not tested with; None for tested ones."""
    untested = []
    if sglang_version not in TESTED_SGLANG_VERSIONS:
        untested.append(f"sglang {sglang_version}")
    if python_version not in TESTED_PYTHON_VERSIONS:
        untested.append(f"Python {python_version}")
    if not untested:
        return None
    return (
        f"the expert-layout plugin runs on {' and '.join(untested)}, but was tested with {tested_versions()}; "
        f"it checks at startup that sglang applied every hook it needs and turns rebalancing of shared "
        f"weights off if not, but other changes in sglang may not be caught"
    )


@dataclass(frozen=True)
class InstallCheck:
    """What the install check found in this process (``engine_adapter.install_check``)."""

    missing: tuple[str, ...]  # targets whose hook sglang will not call
    sglang_version: str
    python_version: str

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def warning(self) -> str | None:
        return untested_warning(self.sglang_version, self.python_version)

    @property
    def error(self) -> str | None:
        if self.complete:
            return None
        return (
            f"sglang {self.sglang_version} did not apply the expert-layout plugin's hooks on "
            f"{', '.join(self.missing)} (its log says 'Failed to apply hooks to ...'); the plugin was tested "
            f"with {tested_versions()}. Rebalancing of shared weights is off for this engine: "
            f"install a tested sglang version"
        )
