"""A handler in the user's own package, run from the user's own folder (issue #24, point 1).

semel is installed from its wheel into a fresh venv; the project lives
outside the checkout, as a new user's would: ``myservice/handlers.py``, a
Procfile ``worker: semel consume`` and a ``.env`` naming the handler.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from semel.settings import Settings
from tests.consumer.harness import Broker, eventually
from tests.install.fresh import Venv
from tests.install.honcho import Honcho, honcho_start

# The first test of a session waits for the wheel and the venv: about 25 s on
# a quiet machine, minutes on a loaded one or while the wheelhouse is filled
# from the index. Each step has a deadline of its own (tests/install/fresh.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HANDLER = '''\
"""The project's handler: notes each key it ran for, one line each."""

import os

# The project's own top-level modules, named as semel's packages once were:
# each side must get its own.
import settings
import stores

from semel.consumer import Context


def record(ctx: Context) -> None:
    fd = os.open(stores.log_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (ctx.key + "\\n").encode())
    finally:
        os.close(fd)
'''


def write_project(folder: Path) -> Path:
    project = folder / "myservice-project"
    package = project / "myservice"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "handlers.py").write_text(HANDLER)
    (project / "settings.py").write_text('LOG_VARIABLE = "HANDLED_LOG"\n')
    (project / "stores.py").write_text(
        "import os\n\nimport settings\n\n\n"
        "def log_path() -> str:\n    return os.environ[settings.LOG_VARIABLE]\n"
    )
    (project / "Procfile").write_text("worker: semel consume\n")
    (project / ".env").write_text("SEMEL_HANDLER=myservice.handlers:record\n")
    return project


def handled(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


async def worker_attached(broker: Broker, settings: Settings, honcho: Honcho) -> None:
    async def attached() -> bool:
        if honcho.exited() is not None:
            pytest.fail(f"honcho stopped before the worker consumed:\n{honcho.output()}")
        return await broker.consumers(settings.queue) > 0

    await eventually(attached, 30, "the worker consuming")


async def test_the_procfile_runs_a_handler_of_the_project_folder(
    venv: Venv, tmp_path: Path, settings: Settings, broker: Broker
) -> None:
    project = write_project(tmp_path)
    log = tmp_path / "handled.log"
    env = venv.environ(
        SEMEL_AMQP_URL=settings.amqp_url,
        SEMEL_QUEUE=settings.queue,
        SEMEL_EXCHANGE=settings.exchange,
        SEMEL_METRICS_PORT="0",
        HANDLED_LOG=str(log),
    )
    keys = {f"order-{n}" for n in range(1, 21)}
    with honcho_start(project, env) as honcho:
        await worker_attached(broker, settings, honcho)
        honcho.remember_groups()
        published = venv.run(
            *("semel", "publish", "--count", "20", "--duplicates", "0.25"),
            *("--key-prefix", "order", "--json"),
            cwd=project,
            env=env,
        )
        assert published.returncode == 0, published.stderr
        assert json.loads(published.stdout)["confirmed"] == 25  # five keys sent twice

        async def all_handled_and_settled() -> bool:
            depths = await broker.depths(settings)
            return set(handled(log)) == keys and not any(depths.values())

        await eventually(all_handled_and_settled, 30, "every key handled")
        honcho.stop()

        async def stopped() -> bool:
            return honcho.exited() is not None

        await eventually(stopped, 30, "honcho stopped")
        # The worker's own exit code is not honcho's to report: it signals the
        # shell of the Procfile line too, whose code it prints.
        output = honcho.output()
        assert "stop requested" in output, output
        assert "Traceback" not in output, output

    assert Counter(handled(log)) == dict.fromkeys(keys, 1)


@pytest.mark.parametrize("how", ["--app-dir", "SEMEL_APP_DIR"])
def test_another_folder_is_named_with_app_dir(venv: Venv, tmp_path: Path, how: str) -> None:
    project = write_project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # An attribute the module lacks: the handler is refused (exit 2) once its
    # module was imported, before the broker is reached.
    env = venv.environ(SEMEL_HANDLER="myservice.handlers:absent", SEMEL_METRICS_PORT="0")
    unnamed = venv.run("semel", "consume", cwd=elsewhere, env=env)
    assert unnamed.returncode == 2
    assert "cannot import 'myservice.handlers'" in unnamed.stderr, unnamed.stderr
    if how == "--app-dir":
        named = venv.run("semel", "consume", "--app-dir", str(project), cwd=elsewhere, env=env)
    else:
        named = venv.run("semel", "consume", cwd=elsewhere, env=env | {how: str(project)})
    assert named.returncode == 2
    assert "'myservice.handlers' has no attribute 'absent'" in named.stderr, named.stderr
