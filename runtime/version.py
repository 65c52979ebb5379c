"""The controller's version: what `coldstart --version` prints and what every run records it was resolved by."""

from __future__ import annotations

from pathlib import Path

__all__ = ["controller_version"]


def controller_version() -> str:
    """The installed distribution's version; a source tree's pyproject.toml when coldstart is not installed."""
    from importlib import metadata

    try:
        return metadata.version("coldstart")
    except metadata.PackageNotFoundError:
        import tomllib

        try:
            with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as file:
                return str(tomllib.load(file)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"
