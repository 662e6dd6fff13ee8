"""The Hugging Face Hub without torch: whether this process runs offline, and staging a model at a pinned commit
into a shared cache on a login node (with internet) for compute nodes that run offline."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NETWORK_EVENTS = ("socket.getaddrinfo", "socket.connect")  # Python's audit events of a connection's first steps
_recorders: list[list[str]] = []  # one list per open `network_attempts` block
_hooked: list[bool] = []  # the audit hook, once per process: audit hooks cannot be removed


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def _audit(event: str, args: tuple) -> None:
    if _recorders and event in NETWORK_EVENTS:
        where = args[0] if event == "socket.getaddrinfo" else args[1]
        for found in _recorders:
            found.append(f"{event} {where}")


@contextmanager
def network_attempts() -> Iterator[list[str]]:
    """The connections this process starts to make (host lookups, connects) while the block runs, from Python's audit
    events: what "read offline" means, whatever HF_HUB_OFFLINE says."""
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    found: list[str] = []
    _recorders.append(found)
    try:
        yield found
    finally:
        _recorders.remove(found)


def stage_folder(folder: Path, name: str, cache_dir: Path, commit: str) -> Path:
    """A local model folder copied into a Hugging Face cache as hub model `name` at `commit` (its snapshot, and `main`
    pointing to it), as `stage` leaves a downloaded one: a GPU check's model read offline without the Hub."""
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(cache_dir) / repo_folder_name(repo_id=name, repo_type="model")
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


STAGED_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "tokenizer*"]
STAGED_BIN_FILES = ["pytorch_model*.bin", "pytorch_model*.bin.index.json"]


def stage(name: str, cache_dir: str | None, revision: str | None = None) -> str:
    """Download a hub model (its PyTorch files) into a (shared) cache, for compute nodes that run offline.

    With `revision` (a commit), that commit is downloaded and the cache's `main` points to it, so that the
    offline trainer, which loads `main`, gets exactly the pinned files. Returns the snapshot's path.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    from sacglam_core.atomic import write_text

    if hub_offline():
        raise RuntimeError("HF_HUB_OFFLINE is set: staging needs the Hub (run it on a login node with internet)")
    path = snapshot_download(name, cache_dir=cache_dir, revision=revision, allow_patterns=STAGED_FILES)
    if not any(Path(path).glob("*.safetensors")):
        path = snapshot_download(name, cache_dir=cache_dir, revision=revision, allow_patterns=STAGED_BIN_FILES)
    if revision:
        refs = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model") / "refs"
        refs.mkdir(parents=True, exist_ok=True)
        write_text(refs / "main", Path(path).name)  # the snapshot folder is named by its commit
    return path
