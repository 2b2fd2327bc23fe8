"""The subprocess helpers the tools share: a server that dies at start-up is reported with its log's last lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance.tools.procs import free_port, wait_serving


def test_a_server_that_exits_before_serving_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    script = ("import sys\nfor i in range(30): print(f'line {i}', file=sys.stderr)\n"
              "print('config error: [server] listen: 127.0.0.1:9400 is in use', file=sys.stderr)\nsys.exit(78)\n")
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", script], stderr=f)
    proc.wait(30)
    with pytest.raises(RuntimeError) as info:
        wait_serving(f"127.0.0.1:{free_port()}", 10, proc=proc, log=str(log))
    message = str(info.value)
    assert "exited with 78" in message and str(log) in message
    assert "  | config error: [server] listen: 127.0.0.1:9400 is in use" in message  # the cause, even once deleted
    assert "  | line 19" in message and "line 18" not in message  # only the last lines
    log.write_text("")
    with pytest.raises(RuntimeError, match="daemon.log is empty"):
        wait_serving(f"127.0.0.1:{free_port()}", 10, proc=proc, log=str(log))
    with pytest.raises(RuntimeError, match=r"exited with 78$"):
        wait_serving(f"127.0.0.1:{free_port()}", 10, proc=proc)
