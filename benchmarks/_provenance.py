"""Provenance stamped into every committed measurement: where, when, with what, how."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import shlex
import sys


def provenance(packages=("numpy",), extra: dict | None = None) -> dict:
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable.split("/")[-1]] + sys.argv),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "packages": versions,
    }
    info.update(extra or {})
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
