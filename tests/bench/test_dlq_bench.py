"""The DLQ benchmark still runs end to end: ``python -m bench.dlq --letters 2000 --quick``.

Only that every command ran, left the DLQ as it should and was measured, and
that everything the run made was removed: speed is never asserted here (the
paced replay's rate is the bench's own check, shown in its table).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.slow

LETTERS = 2000


def leftover_queues(prefix: str) -> list[str]:
    names = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if name.startswith(prefix)]


@pytest.mark.timeout(240)
def test_a_quick_run_measures_every_command_and_leaves_nothing(
    tmp_path: Path, rabbitmq_server: str
) -> None:
    argv = [sys.executable, "-m", "bench.dlq", "--letters", str(LETTERS), "--quick"]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=230
    )
    assert (tmp_path / "dlq.json").exists(), done.stdout[-4000:] + done.stderr[-4000:]
    results: dict[str, Any] = orjson.loads((tmp_path / "dlq.json").read_bytes())
    runs = results["runs"]
    assert [run["argv"].split()[2] for run in runs] == [
        "list",
        "groups",
        "list",
        "replay",
        "replay",
    ]
    for run in runs:
        assert run["exit"] == 0, run["stderr_tail"]
        assert run["wall_s"] > 0
        assert run["peak_rss_mib"] > 0
        # The rate check alone may miss on a loaded machine; the rest never.
        assert [p for p in run["problems"] if "copies arrived at" not in p] == [], run
    burst = results["meta"]["groups"][results["meta"]["burst_group"]]
    assert runs[-1]["dlq_after"] == LETTERS - burst
    assert results["copies_per_s"] > 0
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-4000:]
    assert "replay --group <burst>" in done.stdout  # the table was printed
    assert leftover_queues(results["meta"]["queue"]) == []
