"""``semel.stores.open_store``: a store from a URL, on each backend's real server."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from semel.stores import Outcome, Status, StoreConfig, open_store
from tests.servers import ROOT

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64
OTHER_FP = "0" * 64
CLIENT_LIBRARIES = ("psycopg", "psycopg_pool", "redis", "boto3", "botocore")


def url_for(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """The URL naming the test server of ``backend``."""
    if backend == "sqlite-absolute":
        return f"sqlite:///{tmp_path}/keys.db"  # the path's own slash makes four
    if backend == "sqlite-relative":
        return "sqlite:///keys.db"  # the test runs in tmp_path
    if backend in ("postgresql", "postgres"):
        dsn: str = request.getfixturevalue("postgres_server")
        return dsn.replace("postgresql://", f"{backend}://")
    if backend == "redis":
        url: str = request.getfixturevalue("redis_server")
        return url
    if backend in ("redis-sentinel", "redis-cluster"):
        topology_url: str = request.getfixturevalue(backend.replace("-", "_")).url
        return topology_url
    endpoint = request.getfixturevalue(f"{backend.removeprefix('dynamodb-')}_endpoint")
    return f"dynamodb://semel_keys?region=us-east-1&endpoint_url={endpoint}"


URLS = [
    "sqlite-absolute",
    "sqlite-relative",
    "postgresql",
    "postgres",
    "redis",
    "redis-sentinel",
    "redis-cluster",
    "dynamodb-moto",
    "dynamodb-dynalite",
]


@pytest.mark.parametrize("backend", URLS)
async def test_a_url_opens_its_backend_which_runs_a_key_once(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = StoreConfig(key_prefix="t" + uuid.uuid4().hex[:12])
    async with await open_store(url_for(request, backend, tmp_path), config=config) as store:
        await store.migrate()
        claim = await store.claim("k", FP)
        assert claim.outcome is Outcome.CLAIMED
        assert await store.complete("k", claim.fence, {"paid": 1250})
        record = await store.get("k")
        assert record is not None
        assert (record.status, record.result, record.fence) == (
            Status.COMPLETED,
            {"paid": 1250},
            claim.fence,
        )
        again = await store.claim("k", FP)
        assert (again.outcome, again.record.result) == (Outcome.DUPLICATE, {"paid": 1250})
        reused = await store.claim("k", OTHER_FP)
        assert reused.outcome is Outcome.MISMATCH
    if backend.startswith("sqlite"):
        assert (tmp_path / "keys.db").is_file()


async def test_the_backends_options_reach_it(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:///{tmp_path}/keys.db", table="other_keys") as store:
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
    with contextlib.closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert ("other_keys",) in rows


async def test_an_unknown_scheme_is_refused_in_one_line_naming_it_and_the_accepted() -> None:
    with pytest.raises(ValueError, match="mysql") as refused:
        await open_store("mysql://user:s3cret@db.internal/keys")
    message = str(refused.value)
    assert "\n" not in message
    assert "s3cret" not in message  # a URL may carry a password
    for scheme in ("sqlite://", "postgresql://", "redis://", "redis+cluster://", "dynamodb://"):
        assert scheme in message
    with pytest.raises(ValueError, match="without a scheme"):
        await open_store("localhost/keys")


@pytest.mark.parametrize(
    "url",
    ["sqlite://host/keys.db", "sqlite://", "dynamodb://", "dynamodb://t/x", "dynamodb://t?bogus=1"],
)
async def test_a_url_of_another_form_is_refused_before_anything_opens(url: str) -> None:
    with pytest.raises(ValueError, match=r"store URL is"):
        await open_store(url)


async def test_an_option_the_backend_does_not_take_is_refused() -> None:
    with pytest.raises(TypeError, match="replicas_ack"):
        await open_store("sqlite:///keys.db", replicas_ack=1)


def run_python(code: str, *, uninstalled: str = "") -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, the modules ``uninstalled`` names unimportable."""
    prelude = textwrap.dedent(
        f"""
        import asyncio, sys
        from tests.settings.blocked_import import Uninstalled
        sys.meta_path.insert(0, Uninstalled({set(uninstalled.split(",")) - {""}!r}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_importing_the_stores_and_opening_sqlite_import_no_client_library(
    tmp_path: Path,
) -> None:
    proc = run_python(
        f"""
        import semel.stores
        print(sorted(m for m in sys.modules if m.split(".")[0] in {CLIENT_LIBRARIES!r}))
        async def main():
            async with await semel.stores.open_store("sqlite:///{tmp_path}/k.db") as store:
                await store.get("k")
        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.split(".")[0] in {CLIENT_LIBRARIES!r}))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "[]"]


@pytest.mark.parametrize(
    ("url", "library", "extra"),
    [
        ("redis://localhost:6379/0", "redis", "redis"),
        ("postgresql://localhost/test", "psycopg", "postgres"),
        ("dynamodb://semel_keys", "boto3", "dynamodb"),
    ],
)
def test_a_missing_client_library_names_the_extra_to_install(
    url: str, library: str, extra: str
) -> None:
    proc = run_python(
        f"""
        import semel.stores
        try:
            asyncio.run(semel.stores.open_store({url!r}))
        except ModuleNotFoundError as exc:
            print(exc)
        """,
        uninstalled=library,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"needs the {extra!r} extra" in proc.stdout
    assert f"pip install 'semel[{extra}]'" in proc.stdout
