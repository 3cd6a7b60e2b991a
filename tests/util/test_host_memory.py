"""What this process may still allocate: the host's free memory, its own address-space limit and its
control group's limit, whichever is least."""

import resource

import pytest

from mlptrain.util import host_memory
from mlptrain.util.host_memory import address_space_available, cgroup_available, host_available, out_of_memory


def _group(folder, limit, usage, names=("memory.max", "memory.current")):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / names[0]).write_text(f"{limit}\n")
    (folder / names[1]).write_text(f"{usage}\n")


def test_cgroup_v2_takes_the_least_left_of_the_group_and_its_parents(tmp_path):
    membership = tmp_path / "cgroup"
    membership.write_text("0::/slice/job\n")
    _group(tmp_path / "root" / "slice", 10 * 2**30, 2 * 2**30)  # 8 GiB left above
    _group(tmp_path / "root" / "slice" / "job", 3 * 2**30, 2**30)  # 2 GiB left here
    assert cgroup_available(tmp_path / "root", membership) == 2 * 2**30
    (tmp_path / "root" / "slice" / "job" / "memory.max").write_text("max\n")
    assert cgroup_available(tmp_path / "root", membership) == 8 * 2**30


def test_cgroup_v1_and_a_container_whose_path_is_not_under_the_mount(tmp_path):
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/elsewhere/abc\n1:cpu:/\n")
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
    _group(tmp_path / "root" / "memory", 512 * 2**20, 500 * 2**20, names)  # the container's own group
    assert cgroup_available(tmp_path / "root", membership) == 12 * 2**20
    _group(tmp_path / "root" / "memory", 9223372036854771712, 2**30, names)  # v1's "no limit"
    assert cgroup_available(tmp_path / "root", membership) is None


def test_no_readable_group_says_nothing(tmp_path):
    assert cgroup_available(tmp_path / "none", tmp_path / "missing") is None


def test_the_address_space_limit_counts_what_is_mapped_already(tmp_path, monkeypatch):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmSize:\t  1048576 kB\n")
    limits = {resource.RLIMIT_AS: (3 * 2**30, resource.RLIM_INFINITY), resource.RLIMIT_STACK: (2**20, 2**20)}
    monkeypatch.setattr(host_memory.resource, "getrlimit", lambda which: limits[which])
    assert address_space_available(status) == 2 * 2**30 - host_memory.THREADS_RESERVED * 2**20
    limits[resource.RLIMIT_AS] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert address_space_available(status) is None


def test_host_available_is_the_least_of_the_three(monkeypatch):
    monkeypatch.setattr(host_memory, "_meminfo_available", lambda: 64 * 2**30)
    monkeypatch.setattr(host_memory, "address_space_available", lambda: 3 * 2**30)
    monkeypatch.setattr(host_memory, "cgroup_available", lambda: 5 * 2**30)
    assert host_available() == 3 * 2**30 and host_memory.binding_limit() == "ulimit -v"
    monkeypatch.setattr(host_memory, "address_space_available", lambda: None)
    assert host_available() == 5 * 2**30 and host_memory.binding_limit() == "the control group's memory limit"


@pytest.mark.parametrize("error, fragment", [
    (MemoryError("Unable to allocate 1.07 GiB for an array with shape (12000, 12000) and data type float64"),
     "out of memory: allocating 1.07 GiB for an array"),
    (RuntimeError("can't start new thread"), "out of memory: starting a thread failed"),
])
def test_out_of_memory_is_one_line(error, fragment):
    line = out_of_memory(error)
    assert fragment in line and "\n" not in line
