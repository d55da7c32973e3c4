"""Fake torch builds for `matmul-drift bisect` without downloading torch.

Each is a real wheel, ``torch-<version>-py3-none-any.whl``, that pip lists and uv installs:
it holds no torch of its own, only a .pth file that puts this interpreter's site-packages
(its real torch, numpy and tabulate) at the end of the path and sets route variables
(MKL_CBWR, ONEDNN_MAX_CPU_ISA) before torch loads. So a build "is" the installed torch
under other settings, and the settings are the change a bisection finds. ``broken`` builds
hold a ``torch`` package whose import fails. Stub numpy and tabulate wheels (metadata only)
let pip resolve them from the folder alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure wheel ``name``-``version`` holding ``files`` (path: text) in ``folder``."""
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fake_builds\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [_record_line(p, t.encode()) for p, t in files.items()] + [f"{info}/RECORD,,"]
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def make(folder: Path, builds: dict[str, dict | None]) -> Path:
    """A find-links folder: one fake torch per version in ``builds`` (its route variables, or
    None for a build whose import fails), and the stub numpy and tabulate."""
    folder.mkdir(parents=True, exist_ok=True)
    site = sysconfig.get_paths()["purelib"]
    for version, env in builds.items():
        if env is None:
            files = {
                "torch/__init__.py": "raise ImportError('this fake build is broken on purpose')\n"
            }
        else:
            line = (
                f"import sys, os; sys.path.append({site!r}); os.environ.update({json.dumps(env)})\n"
            )
            files = {"fake_torch_build.pth": line}
        wheel(folder, "torch", version, files)
    wheel(folder, "numpy", "0.0.1", {})
    wheel(folder, "tabulate", "0.0.1", {})
    return folder


def point(product: dict, env: dict) -> dict:
    """probes/buildpoint.py's answer in a fresh process of this interpreter under ``env``."""
    import os

    p = subprocess.run(
        [sys.executable, "-m", "matmul_drift.probes.buildpoint", json.dumps(product)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return json.loads(p.stdout)
