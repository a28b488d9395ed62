"""Writing a volume's files atomically, as the kubelet's AtomicWriter does.

The files live in a timestamped directory; `..data` is a symlink to it and every
top-level entry is a symlink through `..data`. An update writes a new directory and
swaps `..data` with one rename, so a reader sees the old set or the new set, never a
mix, and a program that re-reads its config file on change finds it complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

DATA = "..data"


def current_files(directory: Path) -> dict[str, bytes] | None:
    """What the volume holds now, or None when it was never written."""
    data = directory / DATA
    if not data.is_symlink():
        return None
    root = data.resolve()
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def write_atomically(directory: Path, files: Mapping[str, bytes], mode: int = 0o644) -> bool:
    """Make `directory` hold exactly `files`; False when it already did (nothing written)."""
    if current_files(directory) == dict(files):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix="..", dir=directory))
    new.chmod(0o755)
    for relative, content in files.items():
        target = new / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    data = directory / DATA
    old = data.resolve() if data.is_symlink() else None
    temporary = directory / "..data_tmp"
    if temporary.is_symlink():
        temporary.unlink()
    temporary.symlink_to(new.name)
    os.replace(temporary, data)
    tops = {Path(relative).parts[0] for relative in files}
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"{DATA}/{top}")
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in tops:
            entry.unlink()
    if old is not None and old != new:
        shutil.rmtree(old, ignore_errors=True)
    return True


def write_file_atomically(path: Path, content: bytes, mode: int = 0o600) -> bool:
    """Replace one file with a rename (the pod's kubeconfig); False when it already held
    `content`."""
    if path.is_file() and path.read_bytes() == content:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
    return True


def ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
