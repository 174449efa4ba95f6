"""Redis server resolution for the demo and the tests: REDIS_URL, else PATH, else embedded."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from celery_redislock.contrib.redis_server import (
    RedisServer,
    embedded_binary,
    find_redis_server,
    redis_url,
)


def test_embedded_binary_when_none_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == embedded_binary()
    with RedisServer() as server:
        assert server.version.startswith("6.2")
        assert redis.Redis.from_url(server.url).ping()


def test_redis_url_prefers_the_environment(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    with redis_url() as url:
        assert url == redis_server.url


def test_started_server_is_gone_after_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with redis_url() as url:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        pid = client.info("server")["process_id"]
        assert client.ping()
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
    with pytest.raises(redis.ConnectionError):
        client.ping()
