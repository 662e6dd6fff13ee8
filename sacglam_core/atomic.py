"""Atomic file writes: nothing is ever half-written under its final name."""

from __future__ import annotations

import os
from pathlib import Path

TEMPORARY = ".{name}.tmp-{pid}"  # where a file is written before it is renamed to `name`


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, flush to disk, then rename over `path`.

    On any error the temporary file is removed (a full disk stays no fuller) and the error raised."""
    path = Path(path)
    tmp = path.with_name(TEMPORARY.format(name=path.name, pid=os.getpid()))
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(directory: str | Path) -> None:
    """Write a file in `directory` (a permission check alone says yes to root on a read-only folder); raises the
    OSError that a later write would have met."""
    directory = Path(directory)
    atomic_write(directory / "write-check", b"")
    (directory / "write-check").unlink()


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete the temporary files that killed writers left in `directory` (call it while no writer runs)."""
    directory = Path(directory)
    stale = sorted(directory.glob(TEMPORARY.format(name="*", pid="*"))) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def save_figure(figure, path: str | Path) -> None:
    """A matplotlib figure saved atomically, in the format its suffix names."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip("."), dpi=150, bbox_inches="tight")
    atomic_write(path, buffer.getvalue())


def write_text(path: str | Path, text: str) -> None:
    atomic_write(path, text.encode())
