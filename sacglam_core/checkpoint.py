"""Checkpoints: written atomically, verified on load, with fallback to the previous good one.

A checkpoint is `ckpt-<n>.shared.pt` (model weights that train, optimizers, counters, metrics rows: written
by rank 0), one `ckpt-<n>.rank<r>.pt` per rank (its environments, open episodes, replay data and RNG
states) and, written last, `ckpt-<n>.json`: the manifest with every file's SHA-256. A checkpoint without a
manifest, or whose files do not match it or do not load, is skipped with a warning; every rank resumes from
the same one. Cleanup removes only files named like checkpoints inside the checkpoint folder, whatever a
manifest says.

A checkpoint records its format. One of an older format is brought to the current one on load, one step per format
(`UPGRADES`), so that the code that restores a run reads the current format alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

from sacglam_core.atomic import atomic_write
from sacglam_core.distributed import Ranks

CHECKPOINT_FILE = re.compile(r"ckpt-(\d{9})\.(json|shared\.pt|rank\d+\.pt)")
# What a checkpoint holds. 1: before the metrics rows and the thread count (it cannot be resumed: the rows are lost);
# 2: what `_from_format_2` fills in could be missing; 3: every part always written.
FORMAT = 3


class CheckpointError(RuntimeError):
    """No usable checkpoint, one that belongs to another run, or one that cannot be written."""


def _serialise(obj: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _manifest_problem(path: Path) -> str | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return str(error)
    return None if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else "no file list"


def _from_format_2(shared: dict, local: dict) -> tuple[dict, dict]:
    """Format 2 as its writers left it over time: a process's one rank at the top of its file (before ranks were
    held), SAC's replay buffer and PPO's generator and segments alone; SAC without its actor's schedule (there was no
    ramp: the schedule as built); statistics without `shown`; no monitor state, resumes, network or checksum."""
    shared, local = dict(shared), dict(local)
    if "shards" not in local:
        local["shards"] = [{key: local.get(key) for key in ("envs", "recorder", "generator", "goals")}]
    local.setdefault("monitor", {})
    algo = local["algo"] = dict(local["algo"])
    if "buffer" in algo:
        algo["buffers"] = [algo.pop("buffer")]
    if "generator" in algo:
        algo["generators"], algo["segments"] = [algo.pop("generator")], [algo["segments"]]
    if "shown" not in algo["stats"]:  # every value was already shown
        algo["stats"] = {"values": algo["stats"], "shown": {k: len(v) for k, v in algo["stats"].items()}}
    if "log_alpha" in shared["algo"] and "actor_schedule" not in shared["algo"]:
        shared["algo"] = {**shared["algo"], "actor_schedule": {"lr_lambdas": [None]}}
    counters = shared["counters"] = dict(shared["counters"])
    for key, value in (("resumes", []), ("network", []), ("weights_checksum", None)):
        counters.setdefault(key, value)
    return shared | {"format": 3}, local


UPGRADES = {2: _from_format_2}  # format -> the step to the next one


def upgrade(shared: dict, local: dict, where: Path) -> tuple[dict, dict]:
    """The checkpoint in the current format."""
    found = shared.get("format", 1)
    while found != FORMAT:
        if found not in UPGRADES:
            raise CheckpointError(
                f"the checkpoints in {where} were written by another version of the trainer (format {found}, this "
                f"one reads {', '.join(map(str, [*UPGRADES, FORMAT]))}); finish the run with that version or use a "
                "new output_dir"
            )
        shared, local = UPGRADES[found](shared, local)
        found = shared["format"]
    return shared, local


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int, ranks: Ranks) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep, self.ranks = keep, ranks

    def save(self, number: int, shared: dict, local: dict) -> None:
        name = f"ckpt-{number:09d}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
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
                self._prune(number)
        except OSError as error:
            raise CheckpointError(
                f"cannot write checkpoint {name} in {self.directory}: {error.strerror or error}; "
                "the checkpoints before it are kept"
            ) from error
        self.ranks.barrier()

    def _files_by_number(self) -> dict[int, list[Path]]:
        files = defaultdict(list)
        for path in self.directory.iterdir():
            match = CHECKPOINT_FILE.fullmatch(path.name)
            if match:
                files[int(match[1])].append(path)
        return files

    def _prune(self, newest: int) -> None:
        """Keep the `keep` newest checkpoints up to `newest` whose manifest reads; remove every other one.

        Checkpoints above `newest` were skipped when this run resumed (they did not verify) and would be
        written again; files without a manifest are leftovers of a save that was killed."""
        readable = []
        for number, paths in sorted(self._files_by_number().items()):
            manifest = self.directory / f"ckpt-{number:09d}.json"
            if number > newest or manifest not in paths:
                continue
            problem = _manifest_problem(manifest)
            if problem:
                _warn(f"removing checkpoint {manifest.name}: its manifest is unreadable ({problem})")
                continue
            readable.append(number)
        kept = set(readable[-self.keep :])
        for number, paths in self._files_by_number().items():
            if number not in kept:
                for path in paths:
                    path.unlink(missing_ok=True)

    def load_latest(self) -> tuple[dict, dict] | None:
        """(shared, this rank's local) state of the newest checkpoint that verifies on every rank, or None."""
        if not self.directory.is_dir():
            return None
        numbers = sorted(n for n, paths in self._files_by_number().items() if any(p.suffix == ".json" for p in paths))
        for number in reversed(numbers):
            manifest_path = self.directory / f"ckpt-{number:09d}.json"
            states, problem = None, None
            try:
                states = self._load(manifest_path)
            except CheckpointError:
                raise
            except Exception as error:  # corrupt, partial or unreadable: try the previous one
                problem = str(error)
            if self.ranks.all(states is not None):
                return states
            _warn(f"skipping checkpoint {manifest_path.name}: {problem or 'another rank could not load it'}")
        return None

    def load_run(self, fingerprint: str, threads: int) -> tuple[dict, dict] | None:
        """The newest good checkpoint in the current format, once it is known to belong to this run: of its
        configuration (`fingerprint`), made with as many torch threads (results depend on it) on every rank."""
        loaded = self.load_latest()
        if loaded is None:
            return None
        shared, local = upgrade(*loaded, self.directory)
        if shared["fingerprint"] != fingerprint:
            raise CheckpointError(
                f"the checkpoints in {self.directory} belong to another configuration "
                f"(fingerprint {shared['fingerprint']}, this run {fingerprint}); use a new output_dir"
            )
        if not self.ranks.all(shared["threads"] == threads):
            raise CheckpointError(
                f"the checkpoints in {self.directory} were made with {shared['threads']} torch threads, this process "
                f"has {threads}, and results depend on it; set threads: {shared['threads']} in the run "
                "configuration to resume"
            )
        return shared, local

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
