"""Redis URLs: one server, a Sentinel-managed primary or a Cluster, as the store reads them
and as start-up refuses them (one line naming the variable, never the password)."""

from __future__ import annotations

import pytest

from semel.settings import ConfigError, load_settings, redact
from semel.stores.redis.url import Mode, parse

SECRET = "pa55-w0rd"


@pytest.mark.parametrize(
    ("url", "mode", "hosts"),
    [
        ("redis://h:6380/2", Mode.STANDALONE, ()),
        ("unix:///run/redis.sock?db=1", Mode.STANDALONE, ()),
        ("redis+sentinel://s1,s2:26380/svc", Mode.SENTINEL, (("s1", 26379), ("s2", 26380))),
        ("rediss+cluster://n1:7000,[::1]:7001/", Mode.CLUSTER, (("n1", 7000), ("::1", 7001))),
        ("redis+cluster://n1", Mode.CLUSTER, (("n1", 6379),)),
    ],
)
def test_the_url_names_the_mode_and_its_hosts(url: str, mode: Mode, hosts: tuple[object]) -> None:
    target = parse(url)
    assert (target.mode, target.hosts) == (mode, hosts)
    assert load_settings(redis_url=url).redis_url == url


def test_a_data_server_gets_the_urls_credentials_database_and_options() -> None:
    url = f"rediss+sentinel://app:{SECRET}@s1,s2/svc/3?ssl_cert_reqs=none&sentinel_password=x"
    target = parse(url)
    assert target.service == "svc"
    assert target.tls
    assert target.sentinel_auth == {"sentinel_password": "x"}
    node = target.node_url(("10.0.0.7", 6390))
    assert node == f"rediss://app:{SECRET}@10.0.0.7:6390/3?ssl_cert_reqs=none"
    assert parse("redis+cluster://:pw@n1,n2/").node_url(("::1", 7000)) == "redis://:pw@[::1]:7000/0"
    assert SECRET not in repr(target)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"redis+cluster://u:{SECRET}@n1,n2/1", "only database 0"),
        (f"redis+sentinel://u:{SECRET}@s1,s2/", "monitored primary"),
        (f"redis+sentinel://u:{SECRET}@s1/svc/x", "monitored primary"),
        (f"redis+sentinel://u:{SECRET}@s1:x,s2/svc", "host[:port]"),
        (f"redis+sentinel://u:{SECRET}@s1,,s2/svc", "host[:port]"),
        (f"redis+raft://u:{SECRET}@h1,h2/", "redis+cluster://"),
        (f"unix+cluster://u:{SECRET}@x", "redis+sentinel://"),
        (f"http://u:{SECRET}@h/", "scheme must be one of"),
    ],
)
def test_a_url_the_store_could_not_read_stops_start_up_in_one_line(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(redis_url=url)
    line = str(info.value)
    assert line.startswith("SEMEL_REDIS_URL")
    assert says in line
    assert "\n" not in line
    assert SECRET not in line
    with pytest.raises(ValueError, match=r"\w") as parsed:  # the store's own reading
        parse(url)
    assert SECRET not in str(parsed.value)


def test_replica_acknowledgements_are_bounded() -> None:
    assert load_settings(redis_replicas_ack=2).redis_replicas_ack == 2
    for wrong in (-1, 17):
        with pytest.raises(ConfigError, match=r"^SEMEL_REDIS_REPLICAS_ACK: "):
            load_settings(redis_replicas_ack=wrong)


def test_a_sentinel_password_is_masked_in_logs() -> None:
    line = f"connecting to redis+sentinel://s1,s2/svc?sentinel_password={SECRET}&x=1"
    assert SECRET not in redact(line)
    assert SECRET not in redact(f"redis+sentinel://app:{SECRET}@s1:26379,s2:26379/svc/0")
