"""``shmbuf doctor``: what this installation runs on, for a bug report or a slow run.

Which path a handle made now would use (the C extension, or pure Python, and why),
the extension's file, Python and numpy, the space of ``/dev/shm``, the namespace, and
which optional dependencies are installed (their versions, read from their metadata:
nothing is imported). Exit status 0; ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

EXTRAS = {  # extra: the distributions it installs (pip install 'shmbuf[EXTRA]')
    "torch": ["torch"], "gym": ["gymnasium"], "hdf5": ["h5py"], "safetensors": ["safetensors"], "arrow": ["pyarrow"],
    "ray": ["ray"], "sb3": ["stable-baselines3"], "torchrl": ["torchrl", "tensordict"], "bench": ["cpprb"]}


def report() -> dict[str, Any]:
    """The facts ``shmbuf doctor`` prints."""
    import numpy as np

    from shmbuf import __version__
    from shmbuf.core import native, segment

    ext = native.extension()
    path = native.path()
    why = ("the C extension" if path == "native" else
           f"{native.ENV}=1 is set" if ext is not None else
           "the C extension is not built (no C compiler at install time, or its build failed): about 3x "
           "slower; install a C compiler (gcc) and reinstall shmbuf")
    free = segment.free_bytes()
    try:
        st = os.statvfs(segment.SHM_DIR)
        total = st.f_blocks * st.f_frsize
    except OSError:
        total = None
    found = {}
    for extra, dists in EXTRAS.items():
        for d in dists:
            try:
                found[d] = metadata.version(d)
            except metadata.PackageNotFoundError:
                found[d] = None
    return {"shmbuf": __version__, "path": path, "why": why,
            "extension": getattr(ext, "__file__", None), "arrays_read_directly": native.ARRAYS_READ_DIRECTLY,
            "python": sys.version.split()[0],
            "platform": platform.platform(), "numpy": np.__version__,
            "dev_shm": {"free_bytes": free, "total_bytes": total,
                        "huge_pages": huge_pages(_read("/proc/mounts"), _read(THP), segment.SHM_DIR)},
            "namespace": os.environ.get(segment.NAMESPACE_ENV) or None,
            "optional": found, "missing_extras": sorted(e for e, ds in EXTRAS.items() if any(found[d] is None for d in ds))}


THP = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def huge_pages(mounts: str | None, shmem_enabled: str | None, shm_dir: str = "/dev/shm") -> dict[str, Any]:
    """Whether files in ``shm_dir`` (a tmpfs) get transparent huge pages, from the text
    of ``/proc/mounts`` (its ``huge=`` option; none: ``never``) and of the kernel's
    ``shmem_enabled`` knob (its ``deny`` or ``force`` override every mount). shmbuf
    does not ``madvise``, so ``huge=advise`` gives it none. None where a file was
    unreadable.

    Examples:
        >>> huge_pages("tmpfs /dev/shm tmpfs rw,relatime 0 0", "always within_size advise [never] deny force")
        {'mount': 'never', 'shmem_enabled': 'never', 'used': False}
        >>> huge_pages("tmpfs /dev/shm tmpfs rw,huge=within_size 0 0", "[never] deny")["used"]
        True
    """
    mount = None
    for line in (mounts or "").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1] == shm_dir:  # (the last mount on it counts)
            opts = dict(o.split("=", 1) if "=" in o else (o, "") for o in parts[3].split(","))
            mount = opts.get("huge", "never")
    knob = None
    if shmem_enabled is not None:
        chosen = [w[1:-1] for w in shmem_enabled.split() if w.startswith("[")]
        knob = chosen[0] if chosen else None
    used = None if mount is None else (knob == "force" or (knob != "deny" and mount in ("always", "within_size")))
    return {"mount": mount, "shmem_enabled": knob, "used": used}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _huge_line(h: dict[str, Any]) -> str:
    if h["used"] is None:
        return "huge pages: unknown (/proc/mounts does not list /dev/shm, or could not be read)"
    where = f"/dev/shm's huge= mount option: {h['mount']}; shmem_enabled: {h['shmem_enabled'] or 'unreadable'}"
    if h["used"]:
        return f"huge pages: buffers in /dev/shm get 2 MiB pages ({where})"
    return (f"huge pages: none for buffers in /dev/shm, 4 KiB pages ({where}); numpy's own arrays of "
            "4 MiB and more ask for 2 MiB pages. Mounting /dev/shm with huge=within_size gives its files 2 MiB pages")


def doctor(args: argparse.Namespace) -> int:
    r = report()
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    shm = r["dev_shm"]
    lines = [f"shmbuf {r['shmbuf']} on Python {r['python']}, numpy {r['numpy']} ({r['platform']})",
             f"path: {r['path']} ({r['why']})",
             f"extension: {r['extension'] or 'not built'}"
             + ("" if not r["extension"] else "; numpy arrays read directly" if r["arrays_read_directly"] else
                "; numpy arrays read through their buffers (this numpy's array layout is not the "
                "expected one: writes ~0.2 us a call slower)"),
             f"/dev/shm: {_size(shm['free_bytes'])} free of {_size(shm['total_bytes'])}",
             _huge_line(shm["huge_pages"]),
             f"namespace: {r['namespace'] or '(none)'}",
             "optional: " + ", ".join(f"{d} {v}" if v else f"{d} (not installed)" for d, v in r["optional"].items())]
    if r["missing_extras"]:
        lines.append("missing extras: " + ", ".join(r["missing_extras"])
                     + " (from a clone: pip install '.[EXTRA]'; shmbuf is not on the package index)")
    print("\n".join(lines))
    return 0
