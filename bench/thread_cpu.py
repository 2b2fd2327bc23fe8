"""Real CPU time per thread of the daemon and its workers, named as Python names them (via ``py-spy dump``).

py-spy's samples count a thread while it is runnable, also when another process holds the core, so on a busy
machine they overstate CPU. This reads the kernel's own per-thread counters (``/proc/<pid>/task/<tid>/stat``)
before and after a load window instead, and takes each thread's Python name from one ``py-spy dump``.

Usage:
    python bench/thread_cpu.py snapshot PID OUT.json     # all threads of PID and its descendants
    python bench/thread_cpu.py diff BEFORE.json AFTER.json REQUESTS
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _names(pid: int) -> dict[str, str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        text = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {m.group(1): m.group(2) for m in re.finditer(r"^Thread (\d+) \([^)]*\): \"([^\"]*)\"", text, re.M)}


def snapshot(pid: int) -> dict[str, dict[str, object]]:
    procs = _tree(pid)
    out: dict[str, dict[str, object]] = {}
    for p in procs:
        role = "daemon" if p == pid else "child"
        names = _names(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "forkserver" in cmd:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            role = "fork server" if ppid == pid else "worker"
        live_s = 0.0
        for tid in tids:
            try:
                stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            out[tid] = {"pid": p, "role": role, "name": names.get(tid, comm),
                        "cpu_s": (int(fields[11]) + int(fields[12])) / TICK}
            live_s += float(out[tid]["cpu_s"])  # type: ignore[arg-type]
        try:  # the process's counters include its ended threads (a JPEG 2000 decoder's pool lives for one frame)
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            out[f"exited-{p}"] = {"pid": p, "role": role, "name": "(exited threads)",
                                  "cpu_s": max(0.0, (int(fields[11]) + int(fields[12])) / TICK - live_s)}
        except OSError:
            pass
    return out


def diff(before: dict, after: dict, requests: float) -> None:
    rows: dict[str, float] = {}
    for tid, a in after.items():
        b = before.get(tid, {"cpu_s": 0.0})
        key = f"{a['role']}/{a['name']}"
        rows[key] = rows.get(key, 0.0) + float(a["cpu_s"]) - float(b["cpu_s"])
    total = sum(rows.values())
    print(f"CPU over the window: {total:.2f} s for {requests:.0f} requests = {1000 * total / requests:.2f} ms/request")
    for key, cpu in sorted(rows.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.01:
            print(f"  {cpu:7.2f} s  {1000 * cpu / requests:7.2f} ms/req  {key}")


if __name__ == "__main__":
    if sys.argv[1] == "snapshot":
        Path(sys.argv[3]).write_text(json.dumps(snapshot(int(sys.argv[2]))))
    else:
        diff(json.loads(Path(sys.argv[2]).read_text()), json.loads(Path(sys.argv[3]).read_text()),
             float(sys.argv[4]))
