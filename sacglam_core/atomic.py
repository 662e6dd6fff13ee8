"""Atomic file writes: nothing is ever half-written under its final name."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, flush to disk, then rename over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_figure(figure, path: str | Path) -> None:
    """A matplotlib figure saved atomically, in the format its suffix names."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip("."), dpi=150, bbox_inches="tight")
    atomic_write(path, buffer.getvalue())


def write_text(path: str | Path, text: str) -> None:
    atomic_write(path, text.encode())
