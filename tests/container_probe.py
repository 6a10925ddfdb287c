"""A stand-in payload for container tests: it reports what the container sees (cgroup v1)."""

from __future__ import annotations

# Runs inside the container in place of the payload: ready line, then one JSON report.
PROBE = r"""
import json, os, subprocess, sys, time
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
def read(path):
    with open(path) as f:
        return f.read().strip()
start = time.process_time()
while time.process_time() - start < 0.5:  # CPU the environment's cgroup must account
    pass
tools = {t: subprocess.run([t, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
         for t in ("git", "gcc", "make")}
print(json.dumps({
    "cpus": read("/sys/fs/cgroup/cpuset/cpuset.cpus"),
    "memory": int(read("/sys/fs/cgroup/memory/memory.limit_in_bytes")),
    "memsw": int(read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")),
    "cfs_quota": int(read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")),
    "cfs_period": int(read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")),
    "cgroup": read("/proc/self/cgroup"),
    "python": sys.executable, "version": sys.version.split()[0],
    "net": sorted(os.listdir("/sys/class/net")), "tools": tools,
    "usr_writable": os.access("/usr", os.W_OK), "payload_writable": os.access(sys.argv[0], os.W_OK),
}), flush=True)
"""

# Runs inside the container in place of the payload: ready line, then far more memory than
# the test's quota allows.
HOG = r"""
import json, sys
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
hog = bytearray(256 * 1024 * 1024)
print(json.dumps({"op": "survived"}), flush=True)
"""
