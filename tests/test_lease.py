"""The run directory's lease: exclusive across processes, named holder, gone with its process."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sacglam_core.lease import LeaseHeldError, RunLease, holder

HOLD = """
import sys, time
from sacglam_core.lease import RunLease
RunLease(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def other_process(tmp_path):
    """Another process that holds the lease of tmp_path / 'run' until it is killed."""
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_second_holder_is_refused_with_the_holders_name(tmp_path, other_process):
    with pytest.raises(LeaseHeldError) as error:
        RunLease(tmp_path / "run").acquire()
    message = str(error.value)
    assert f"pid {other_process.pid}" in message and "SLURM job 4242" in message
    assert holder(tmp_path / "run")["pid"] == other_process.pid


def test_the_lease_dies_with_its_process_even_on_kill_9(tmp_path, other_process):
    other_process.send_signal(signal.SIGKILL)
    other_process.wait()
    assert holder(tmp_path / "run") is None
    with RunLease(tmp_path / "run"):
        assert holder(tmp_path / "run")["pid"] == os.getpid()
    assert holder(tmp_path / "run") is None


def test_two_leases_in_one_process_also_exclude_each_other(tmp_path):
    first = RunLease(tmp_path / "run")
    first.acquire()
    with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()}"):
        RunLease(tmp_path / "run").acquire()
    first.release()
    RunLease(tmp_path / "run").acquire()


def test_no_lease_file_means_no_holder(tmp_path):
    assert holder(tmp_path / "nothing") is None
    started = time.time()
    with RunLease(tmp_path / "new" / "run") as lease:
        assert lease.path.exists() and holder(tmp_path / "new" / "run")["time"] >= started - 1


LOOK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
print("looking", flush=True)
time.sleep(0.5)
"""


def test_a_look_at_the_lease_does_not_refuse_a_trainer_starting_meanwhile(tmp_path):
    """`holder()` takes the lease shared for a moment (status, the driver): a trainer that starts then waits for the
    look to end instead of being refused as if the lease were held."""
    lease = RunLease(tmp_path / "run")
    lease.path.parent.mkdir()
    lease.path.touch()
    looking = subprocess.Popen([sys.executable, "-c", LOOK, str(lease.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert looking.stdout.readline().strip() == "looking"
        started = time.monotonic()
        lease.acquire()
        assert time.monotonic() - started > 0.05  # it waited for the look to end
        assert holder(tmp_path / "run")["pid"] == os.getpid()
    finally:
        looking.kill()
        looking.wait()
        lease.release()


def test_a_hand_edited_record_still_names_the_holder(tmp_path):
    """A record whose time is not a number (edited by hand, or by another tool) must not turn the refusal into a
    traceback: the holder is named, its start is "?"."""
    first = RunLease(tmp_path / "run")
    first.acquire()
    first.path.write_text('{"pid": 4242, "host": "node12", "time": "yesterday"}')
    try:
        with pytest.raises(LeaseHeldError, match="in use by pid 4242 on node12, since \\?; one trainer"):
            RunLease(tmp_path / "run").acquire()
    finally:
        first.release()
