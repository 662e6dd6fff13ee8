"""Checkpoint files under hostile conditions: unreadable manifests, manifests naming other files, failed
writes, ranks that disagree about which checkpoint verifies."""

import json
import os
import socket
import subprocess
import sys

import pytest

from sacglam_core import atomic
from sacglam_core.atomic import atomic_write, remove_stale_temporaries
from sacglam_core.checkpoint import Checkpointer, CheckpointError
from sacglam_core.distributed import Ranks


def save(checkpointer: Checkpointer, number: int) -> None:
    checkpointer.save(number, {"number": number}, {"rank": 0})


def numbers(directory) -> list[int]:
    return sorted(int(p.name[5:14]) for p in directory.glob("ckpt-*.json"))


def test_an_unreadable_old_manifest_is_skipped_removed_and_keep_still_holds(tmp_path, capsys):
    checkpointer = Checkpointer(tmp_path, keep=2, ranks=Ranks())
    save(checkpointer, 1)
    save(checkpointer, 2)
    (tmp_path / "ckpt-000000001.json").write_bytes(b"")  # zeroed, as a crash or a full disk leaves it
    save(checkpointer, 3)
    assert "removing checkpoint ckpt-000000001.json: its manifest is unreadable" in capsys.readouterr().err
    save(checkpointer, 4)
    assert numbers(tmp_path) == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"ckpt-00000000{n}.{kind}" for n in (3, 4) for kind in ("json", "rank0.pt", "shared.pt")
    ]
    assert checkpointer.load_latest()[0] == {"number": 4}


def test_an_unreadable_newest_manifest_falls_back_and_is_replaced(tmp_path, capsys):
    checkpointer = Checkpointer(tmp_path, keep=2, ranks=Ranks())
    save(checkpointer, 1)
    save(checkpointer, 2)
    (tmp_path / "ckpt-000000002.json").write_text("{not json")
    assert checkpointer.load_latest()[0] == {"number": 1}
    assert "skipping checkpoint ckpt-000000002.json" in capsys.readouterr().err
    save(checkpointer, 2)  # the resumed run reaches step 2 again
    assert numbers(tmp_path) == [1, 2] and checkpointer.load_latest()[0] == {"number": 2}


def test_checkpoints_the_run_resumed_past_are_removed(tmp_path):
    """A newer checkpoint that failed to verify is not kept in place of the one just written."""
    checkpointer = Checkpointer(tmp_path, keep=2, ranks=Ranks())
    save(checkpointer, 1)
    save(checkpointer, 3)
    (tmp_path / "ckpt-000000003.shared.pt").write_bytes(b"truncated")
    assert checkpointer.load_latest()[0] == {"number": 1}
    save(checkpointer, 2)  # the resumed run goes on from step 1
    assert numbers(tmp_path) == [1, 2]


def test_cleanup_removes_only_checkpoint_files_inside_the_folder(tmp_path):
    directory = tmp_path / "run" / "checkpoints"
    checkpointer = Checkpointer(directory, keep=1, ranks=Ranks())
    save(checkpointer, 1)
    outside, absolute = tmp_path / "run" / "metrics.csv", tmp_path / "elsewhere.txt"
    outside.write_text("rows")
    absolute.write_text("data")
    stray = directory / "notes.txt"
    stray.write_text("mine")
    manifest = directory / "ckpt-000000001.json"
    files = json.loads(manifest.read_text())["files"] | {"../metrics.csv": "0", str(absolute): "0", "notes.txt": "0"}
    manifest.write_text(json.dumps({"number": 1, "world": 1, "files": files}))
    save(checkpointer, 2)
    assert outside.read_text() == "rows" and absolute.read_text() == "data" and stray.read_text() == "mine"
    assert numbers(directory) == [2]


def test_orphans_of_killed_saves_are_cleaned_up(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=1, ranks=Ranks())
    (tmp_path / "ckpt-000000001.shared.pt").write_bytes(b"killed before its manifest")
    save(checkpointer, 2)
    assert not (tmp_path / "ckpt-000000001.shared.pt").exists()


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "big.pt", b"x" * 1000)
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=1, ranks=Ranks())
    with pytest.raises(CheckpointError, match="cannot write checkpoint ckpt-000000001 .*No space left on device"):
        save(checkpointer, 1)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_stale_temporaries_are_found_and_removed(tmp_path):
    (tmp_path / ".ckpt-000000001.shared.pt.tmp-4242").write_bytes(b"killed mid-write")
    (tmp_path / "ckpt-000000001.json").write_text("{}")
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [".ckpt-000000001.shared.pt.tmp-4242"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000001.json"]


RANK = """
import os, sys
import torch.distributed as dist
from sacglam_core.checkpoint import Checkpointer
from sacglam_core.distributed import Ranks
rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method=sys.argv[3], rank=rank, world_size=2)
checkpointer = Checkpointer(sys.argv[1], keep=3, ranks=Ranks(rank, 2))
for n in (1, 2):
    checkpointer.save(n, {"number": n}, {"rank": rank, "number": n})
    if n == 2 and rank == 1:  # only rank 1's file of the newest checkpoint is corrupt
        open(os.path.join(sys.argv[1], "ckpt-000000002.rank1.pt"), "wb").write(b"corrupt")
    dist.barrier()
shared, local = checkpointer.load_latest()
print(shared["number"], local["number"])
dist.barrier()  # neither rank may leave while the other's gloo threads still talk to it: that aborts (-6)
dist.destroy_process_group()
"""


def test_every_rank_falls_back_to_the_same_checkpoint(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path), str(r), f"tcp://127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outputs = [p.communicate(timeout=300) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outputs
    assert [out.split() for out, _ in outputs] == [["1", "1"], ["1", "1"]]
