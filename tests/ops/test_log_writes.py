"""Lines written at once from a plain handler's thread (through ``logging``) and
from the event loop (through structlog) never land inside each other."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.timeout(60)

LINES = 5000
SCRIPT = f"""
import logging, threading, structlog
from semel.consumer.ops.logs import LogSetup, configure

configure(LogSetup(as_json=True))

def from_a_thread():
    for n in range({LINES}):
        logging.getLogger("myservice").info("from a thread %d", n)

thread = threading.Thread(target=from_a_thread)
thread.start()
for n in range({LINES}):
    structlog.get_logger().info("from the loop", n=n)
thread.join()
"""


def test_lines_from_a_thread_and_the_loop_stay_whole() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each one whole
    kinds = Counter(line["event"].split(" ", 3)[1] for line in lines)
    assert kinds == {"a": LINES, "the": LINES}
