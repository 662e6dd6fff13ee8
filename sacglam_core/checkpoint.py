"""Checkpoints: written atomically, verified on load, with fallback to the previous good one.

A checkpoint is `ckpt-<n>.shared.pt` (model weights that train, optimizers, counters: written by rank 0),
one `ckpt-<n>.rank<r>.pt` per rank (its environments, open episodes, replay data and RNG states) and,
written last, `ckpt-<n>.json`: the manifest with every file's SHA-256. A checkpoint without a manifest,
or whose files do not match it or do not load, is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import torch

from sacglam_core.atomic import atomic_write
from sacglam_core.distributed import Ranks


class CheckpointError(RuntimeError):
    """No usable checkpoint, or one that belongs to another run."""


def _serialise(obj: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int, ranks: Ranks) -> None:
        self.directory = Path(directory)
        self.keep, self.ranks = max(1, keep), ranks
        self.directory.mkdir(parents=True, exist_ok=True)

    def save(self, number: int, shared: dict, local: dict) -> None:
        name = f"ckpt-{number:09d}"
        local_bytes = _serialise(local)
        atomic_write(self.directory / f"{name}.rank{self.ranks.rank}.pt", local_bytes)
        digests = self.ranks.gather_strings(hashlib.sha256(local_bytes).hexdigest())
        if self.ranks.is_main:
            shared_bytes = _serialise(shared)
            atomic_write(self.directory / f"{name}.shared.pt", shared_bytes)
            files = {f"{name}.shared.pt": hashlib.sha256(shared_bytes).hexdigest()}
            files |= {f"{name}.rank{r}.pt": d for r, d in enumerate(digests)}
            manifest = {"number": number, "world": self.ranks.world, "files": files}
            atomic_write(self.directory / f"{name}.json", json.dumps(manifest, indent=1).encode())
            self._prune()
        self.ranks.barrier()

    def _prune(self) -> None:
        manifests = sorted(self.directory.glob("ckpt-*.json"))
        for old in manifests[: -self.keep]:
            for file in json.loads(old.read_text())["files"]:
                (self.directory / file).unlink(missing_ok=True)
            old.unlink()

    def load_latest(self) -> tuple[dict, dict] | None:
        """(shared, this rank's local) state of the newest checkpoint that verifies, or None if there is none."""
        for manifest_path in sorted(self.directory.glob("ckpt-*.json"), reverse=True):
            try:
                return self._load(manifest_path)
            except CheckpointError:
                raise
            except Exception as error:  # corrupt, partial or unreadable: try the previous one
                print(f"warning: skipping checkpoint {manifest_path.name}: {error}", file=sys.stderr)
        return None

    def _load(self, manifest_path: Path) -> tuple[dict, dict]:
        manifest = json.loads(manifest_path.read_text())
        if manifest["world"] != self.ranks.world:
            raise CheckpointError(
                f"checkpoint {manifest_path} was written by {manifest['world']} processes; this run has "
                f"{self.ranks.world}. Resume with the same number of processes (GPUs)."
            )
        states = []
        for file in (manifest_path.stem + ".shared.pt", f"{manifest_path.stem}.rank{self.ranks.rank}.pt"):
            data = (self.directory / file).read_bytes()
            if hashlib.sha256(data).hexdigest() != manifest["files"][file]:
                raise ValueError(f"{file} does not match its SHA-256 in the manifest (corrupt or partial)")
            states.append(torch.load(io.BytesIO(data), weights_only=True, map_location="cpu"))
        return states[0], states[1]
