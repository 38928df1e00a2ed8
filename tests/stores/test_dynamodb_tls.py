"""The DynamoDB store over HTTPS: its own client's TLS, proven against a server that speaks it.

Every other DynamoDB test talks plain HTTP to a local server; AWS answers on
HTTPS only. Here a TLS-terminating proxy, with a certificate from a CA made
for the test, stands in front of the moto server, and the store is pointed at
it the way a user points botocore at a private CA: ``AWS_CA_BUNDLE``, or
``ca_bundle`` in the AWS config file. The proxy counts the handshakes it
completes and records the server name each client asked for (SNI), so the
tests see TLS was spoken, and kept alive, rather than infer it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from semel.consumer.container import store_options
from semel.settings import Settings
from semel.stores.base import Outcome, Store
from semel.stores.dynamodb import http
from semel.stores.dynamodb import store as dynamodb_store
from semel.stores.dynamodb.store import DynamoDBStore, open_store
from semel.stores.dynamodb.wire import DataPlane
from semel.stores.errors import StoreUnavailable

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64
PrivateKey = ec.EllipticCurvePrivateKey
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,  # the worker's loop
}


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA the client is told to trust
    localhost: Pair  # for localhost and 127.0.0.1, from that CA
    other_host: Pair  # from that CA, for another name
    stranger: Pair  # for localhost, from a CA the client does not know


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    key: PrivateKey,
    issuer: tuple[x509.Name, PrivateKey] | None,
    names: list[x509.GeneralName],
) -> x509.Certificate:
    """A certificate for ``subject``: a CA's own when ``issuer`` is ``None``."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True
        ).add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        # What OpenSSL's strict X.509 checks (Python 3.13's defaults) ask of a leaf.
        builder = (
            builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False,
            )
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(folder: Path, stem: str, cert: x509.Certificate, key: PrivateKey) -> Pair:
    pair = Pair(folder / f"{stem}.pem", folder / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pair


def _make_pki(folder: Path) -> Pki:
    made: dict[str, Pair] = {}
    for ca_name in ("trusted", "stranger"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _issue(f"semel test CA {ca_name}", ca_key, None, [])
        made[f"{ca_name}-ca"] = _write(folder, f"{ca_name}-ca", ca_cert, ca_key)
        leaves = {"localhost": "localhost"}
        if ca_name == "trusted":
            leaves["other"] = "dynamodb.other.test"
        for stem, host in leaves.items():
            key = ec.generate_private_key(ec.SECP256R1())
            names: list[x509.GeneralName] = [x509.DNSName(host)]
            if host == "localhost":
                names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
            cert = _issue(host, key, (ca_cert.subject, ca_key), names)
            made[f"{ca_name}-{stem}"] = _write(folder, f"{ca_name}-{stem}", cert, key)
    return Pki(
        ca=made["trusted-ca"].cert,
        localhost=made["trusted-localhost"],
        other_host=made["trusted-other"],
        stranger=made["stranger-localhost"],
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class Proxy:
    """What the TLS proxy saw: one server name per ClientHello, one entry per handshake done."""

    url: str = ""
    hellos: list[str | None] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    clients: set[asyncio.StreamWriter] = field(default_factory=set)

    def hang_up(self) -> None:
        """Close every client connection, as a server's idle timeout does."""
        for writer in self.clients:
            _close(writer)


def _close(writer: asyncio.StreamWriter) -> None:
    # Once only: Python 3.11's TLS transport forgets its protocol on a second
    # close, and a later abort() then fails (AttributeError in sslproto) instead
    # of cutting the socket; seen once in CI's fresh-machine lane.
    if not writer.is_closing():
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass  # either side cut the connection (an SSL error is an OSError too)
    finally:
        _close(writer)


@contextlib.asynccontextmanager
async def tls_proxy(pair: Pair, upstream: str) -> AsyncIterator[Proxy]:
    """TLS with ``pair`` on a local port, the bytes inside it piped to ``upstream``."""
    proxy = Proxy()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    context.sni_callback = lambda _socket, name, _context: proxy.hellos.append(name)
    target = urlsplit(upstream)
    running: set[asyncio.Task[Any]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Called once the handshake is done: each call is one TLS session.
        task = asyncio.current_task()
        assert task is not None
        running.add(task)
        tls = writer.get_extra_info("ssl_object")
        proxy.versions.append(tls.version())
        proxy.clients.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            proxy.clients.discard(writer)
            _close(writer)

    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=context)
    proxy.url = f"https://localhost:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        server.close()
        await server.wait_closed()
        # botocore's client leaves its sockets to the garbage collector: cut them here
        # (a TLS close would wait for an answer that nothing on that socket reads).
        for writer in proxy.clients:
            writer.transport.abort()
        if running:
            _, late = await asyncio.wait(running, timeout=10)
            assert not late, "a proxied connection outlived the proxy"


def run(loop: str, scenario: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(scenario)


def https_settings(url: str) -> Settings:
    return Settings(
        store="dynamodb",
        dynamodb_endpoint_url=url,
        key_prefix="t" + uuid.uuid4().hex[:12],
        dynamodb_table=f"semel_tls_{uuid.uuid4().hex[:8]}",
    )


async def open_https_store(url: str, data_plane: str = "lean") -> DynamoDBStore:
    options = store_options(https_settings(url))
    store = await open_store(**(options.kwargs | {"data_plane": data_plane}))
    return cast(DynamoDBStore, store)


@pytest.fixture
def ca_in_env(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> Pki:
    monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
    return pki


async def closed(proxy: Proxy, others: set[asyncio.StreamWriter]) -> None:
    """Wait until the store's own connections have ended (TLS closes in a few round trips)."""
    end = time.monotonic() + 10
    while proxy.clients - others:
        assert time.monotonic() < end, "the store's TLS connection outlived the store"
        await asyncio.sleep(0.01)


async def refused(store: Store) -> StoreUnavailable:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await store.ping()
    # A few retries, each refused at once: no wait for a timeout.
    assert time.monotonic() - started < 10
    return info.value


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("given_by", ["AWS_CA_BUNDLE", "config file"])
def test_the_store_speaks_tls_and_keeps_its_connection(
    moto_endpoint: str,
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    loop: str,
    given_by: str,
) -> None:
    if given_by == "AWS_CA_BUNDLE":
        monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
    else:
        config = tmp_path / "aws-config"
        config.write_text(f"[default]\nca_bundle = {pki.ca}\n")
        monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))

    async def scenario() -> None:
        async with tls_proxy(pki.localhost, moto_endpoint) as proxy:
            store = await open_https_store(proxy.url)
            try:
                assert isinstance(store._send, DataPlane)
                await store.migrate()  # botocore, over TLS with the same bundle
                botocores = set(proxy.clients)
                before = len(proxy.versions)
                assert before >= 1
                claim = await store.claim("k", FP)
                assert claim.outcome is Outcome.CLAIMED
                assert await store.complete("k", claim.fence, {"ok": True})
                record = await store.get("k")
                assert record is not None
                assert record.result == {"ok": True}
                assert (await store.claim("k", FP)).outcome is Outcome.DUPLICATE
                # Four calls, one after the other: one handshake, the connection kept.
                assert len(proxy.versions) == before + 1
                # A connection the server closed is replaced by a new handshake.
                proxy.hang_up()
                assert (await store.claim("k", FP)).outcome is Outcome.DUPLICATE
                assert len(proxy.versions) == before + 2
            finally:
                await store.close()
            await closed(proxy, botocores)
            assert set(proxy.hellos) == {"localhost"}  # SNI: the endpoint's host name
            assert set(proxy.versions) <= {"TLSv1.2", "TLSv1.3"}

    run(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_an_endpoint_named_by_address_is_checked_against_the_address(
    moto_endpoint: str, ca_in_env: Pki, loop: str
) -> None:
    async def scenario() -> None:
        async with tls_proxy(ca_in_env.localhost, moto_endpoint) as proxy:
            store = await open_https_store(proxy.url.replace("localhost", "127.0.0.1"))
            try:
                await store.migrate()
                assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
            finally:
                await store.close()
            # No server name is sent for an address; the certificate's IP entry vouches for it.
            assert proxy.hellos
            assert set(proxy.hellos) == {None}

    run(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("server", "reason"),
    [
        # Python's check and urllib3's (botocore's) word a wrong host name differently.
        ("other_host", r"Hostname mismatch|hostname 'localhost' doesn't match"),
        ("stranger", r"CERTIFICATE_VERIFY_FAILED.*unable to get local issuer"),
    ],
)
def test_a_certificate_the_client_cannot_verify_is_refused(
    moto_endpoint: str, ca_in_env: Pki, loop: str, server: str, reason: str
) -> None:
    async def scenario() -> None:
        async with tls_proxy(getattr(ca_in_env, server), moto_endpoint) as proxy:
            for data_plane in ("lean", "botocore"):
                store = await open_https_store(proxy.url, data_plane)
                try:
                    error = await refused(store)
                finally:
                    await store.close()
                # Both clients say why: the certificate, not the network.
                assert "SSLError: SSL validation failed" in str(error), data_plane
                assert re.search(reason, str(error)), (data_plane, str(error))
                if data_plane == "lean":
                    assert proxy.hellos  # the client did reach the server and start TLS
                    # ... and broke the handshake off (botocore's urllib3 checks the host
                    # name once the handshake is done, so the proxy counts its handshakes).
                    assert not proxy.versions

    run(loop, scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_handshake_that_never_ends_is_cut_by_the_connect_timeout(
    moto_endpoint: str, ca_in_env: Pki, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An https:// URL naming a plain HTTP port: the server waits for a request's
    # end in the TLS hello, the client for the server's hello.
    url = moto_endpoint.replace("http://127.0.0.1", "https://localhost")
    monkeypatch.setattr(dynamodb_store, "CONNECT_TIMEOUT", 0.5)

    async def scenario() -> None:
        store = await open_https_store(url)
        try:
            error = await refused(store)
        finally:
            await store.close()
        assert "ConnectTimeoutError" in str(error)

    run(loop, scenario())


@contextlib.contextmanager
def silent_tls_server(pair: Pair) -> Iterator[int]:
    """A TLS server that answers one request, then reads nothing until the test ends:
    a client's close_notify gets no answer, as from a server that went away."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    release = threading.Event()

    def serve() -> None:
        with listener, context.wrap_socket(listener.accept()[0], server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            release.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        release.set()
        thread.join(10)


class Watched(http.Connection):
    """A connection that says when its transport is gone."""

    lost: asyncio.Event

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        Watched.lost.set()


@pytest.mark.parametrize("loop", LOOPS)
def test_closing_a_tls_connection_waits_for_no_answer(
    pki: Pki, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "Connection", Watched)

    async def scenario() -> None:
        Watched.lost = asyncio.Event()
        with silent_tls_server(pki.localhost) as port:
            tls = ssl.create_default_context(cafile=str(pki.ca))
            url = f"https://localhost:{port}"
            pool = http.Pool(url, "localhost", port, tls=tls, size=1, connect_timeout=2)
            try:
                request = b"POST / HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\n\r\n"
                assert (await pool.send(request, 5)).status == 200
                pool.close()
                # The socket is let go at once: a loop that ends now leaves nothing open.
                await asyncio.wait_for(Watched.lost.wait(), 2)
            finally:
                pool.close()
        # The server has hung up: a close still waiting for its answer ends now.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(Watched.lost.wait(), 5)

    run(loop, scenario())
