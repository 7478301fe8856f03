"""Configuration from the environment fails loudly on nonsense and keeps its promises."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw", ["ture", "2", "enabled"])
def test_bad_boolean_is_refused(monkeypatch, raw):
    monkeypatch.setenv("DEBUG", raw)
    with pytest.raises(ImproperlyConfigured, match="DEBUG"):
        env.env_bool("DEBUG", False)


def test_integers_and_lists_are_checked(monkeypatch):
    monkeypatch.setenv("N", "abc")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env.env_int("N", 1)
    monkeypatch.setenv("N", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum"):
        env.env_int("N", 1, minimum=1)
    monkeypatch.setenv("HOSTS", "a,,b")
    with pytest.raises(ImproperlyConfigured, match="empty entry"):
        env.env_list("HOSTS", [])
    monkeypatch.setenv("HOSTS", "a.example, b.example")
    assert env.env_list("HOSTS", []) == ["a.example", "b.example"]


def test_database_urls():
    pg = env.database_from_url("postgres://u:p%40ss@db.internal:6543/tether?sslmode=require")
    assert (pg["ENGINE"], pg["NAME"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"]) == (
        "django.db.backends.postgresql",
        "tether",
        "u",
        "p@ss",
        "db.internal",
        "6543",
    )
    assert pg["OPTIONS"] == {"sslmode": "require"}
    socket = env.database_from_url("postgres:///tether?host=/var/run/postgresql")
    assert socket["HOST"] == "/var/run/postgresql" and socket["OPTIONS"] == {}
    lite = env.database_from_url("sqlite:////srv/tether/db.sqlite3")
    assert lite["NAME"] == "/srv/tether/db.sqlite3"
    with pytest.raises(ImproperlyConfigured, match="scheme"):
        env.database_from_url("mysql://x/y")
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        env.database_from_url("postgres://host/")
    for bad_port in ("postgres://h:notaport/db", "postgres://h:99999/db"):
        with pytest.raises(ImproperlyConfigured, match=r"DATABASE_URL=.* has a port that is not a number"):
            env.database_from_url(bad_port)


def test_secret_key_is_generated_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("SECRET_KEY", raising=False)
    first = env.secret_key(tmp_path, required=False)
    assert len(first) >= 50
    assert env.secret_key(tmp_path, required=False) == first
    assert oct((tmp_path / "secret_key").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        env.secret_key(tmp_path, required=True)
    monkeypatch.setenv("SECRET_KEY", "short")
    with pytest.raises(ImproperlyConfigured, match="at least 50 characters"):
        env.secret_key(tmp_path, required=True)


@pytest.mark.parametrize(
    "raw", ["not a url", "localhost:6379", "http://127.0.0.1:6379", "redis://", "redis://h:port/0", "unix://"]
)
def test_redis_url_that_is_not_one_is_refused(monkeypatch, raw):
    monkeypatch.setenv("REDIS_URL", raw)
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL="):
        env.redis_url("REDIS_URL")


@pytest.mark.parametrize(
    "raw", ["redis://127.0.0.1:6379/0", "rediss://user:secret@redis.internal:6380/1", "unix:///run/redis.sock"]
)
def test_redis_urls_of_each_scheme_are_accepted(monkeypatch, raw):
    monkeypatch.setenv("REDIS_URL", raw)
    assert env.redis_url("REDIS_URL") == raw


def test_empty_redis_url_means_the_in_memory_layer(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert env.redis_url("REDIS_URL") is None
    monkeypatch.setenv("REDIS_URL", " ")
    assert env.redis_url("REDIS_URL") is None


def _check(tmp_path, **overrides) -> subprocess.CompletedProcess:
    ours = {"SECRET_KEY", "DATABASE_URL", "TETHER_MODE", "DEBUG", "REDIS_URL", "ALLOWED_HOSTS"}
    environ = {k: v for k, v in os.environ.items() if k not in ours}
    environ.update(TETHER_DATA_DIR=str(tmp_path), **overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )


def test_start_up_fails_loudly_on_a_typo(tmp_path):
    result = _check(tmp_path, DEBUG="ture")
    assert result.returncode != 0
    assert "DEBUG='ture' is not a boolean" in result.stderr


def test_production_mode_requires_a_secret_key(tmp_path):
    result = _check(tmp_path, TETHER_MODE="production", ALLOWED_HOSTS="tether.example")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
    ok = _check(tmp_path, TETHER_MODE="production", ALLOWED_HOSTS="tether.example", SECRET_KEY=SECRET)
    assert ok.returncode == 0, ok.stderr
    # A bad setting is one line saying which, not a traceback to dig it out of.
    assert result.stderr.strip() == "Tether configuration: SECRET_KEY must be set when TETHER_MODE=production"
    short = _check(tmp_path, TETHER_MODE="production", ALLOWED_HOSTS="tether.example", SECRET_KEY="k" * 50)
    assert "at least 50 characters long, with at least 5 different" in short.stderr


def _last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_start_up_fails_loudly_on_a_redis_url_that_is_not_one(tmp_path):
    result = _check(tmp_path, REDIS_URL="not a url")
    assert result.returncode != 0
    assert "REDIS_URL='not a url': scheme must be redis://, rediss:// or unix://" in _last_line(result)
    assert _check(tmp_path, REDIS_URL="").returncode == 0  # empty is unset: the in-memory layer


def test_start_up_fails_loudly_on_a_database_port_that_is_not_a_number(tmp_path):
    result = _check(tmp_path, DATABASE_URL="postgres://h:notaport/db")
    assert result.returncode != 0
    assert "DATABASE_URL='postgres://h:notaport/db' has a port that is not a number" in _last_line(result)


def test_a_link_over_tls_without_a_certificate_and_a_link_address_that_is_none_are_refused_at_start(tmp_path):
    result = _check(tmp_path, TETHER_LINK_LISTEN="tls:0.0.0.0:9201")
    assert result.returncode != 0
    assert "TETHER_LINK_LISTEN=tls:... needs TETHER_LINK_TLS_CERT" in _last_line(result)
    result = _check(tmp_path, TETHER_LINK_LISTEN="udp:0.0.0.0:9201")
    assert "TETHER_LINK_LISTEN is unix, tcp:HOST:PORT or tls:HOST:PORT: 'udp:0.0.0.0:9201'" in _last_line(result)


SECRET = "a-secret-key-long-enough-for-djangos-own-deployment-check"


def test_production_mode_requires_allowed_hosts(tmp_path):
    secret = SECRET
    for hosts in ({}, {"ALLOWED_HOSTS": ""}):
        result = _check(tmp_path, TETHER_MODE="production", SECRET_KEY=secret, **hosts)
        assert result.returncode != 0
        assert "ALLOWED_HOSTS must be set when TETHER_MODE=production" in _last_line(result)
    assert _check(tmp_path, SECRET_KEY=secret).returncode == 0  # embedded keeps its loopback default


def test_an_unknown_web_loop_stops_the_web_process_at_start_saying_what_is_allowed():
    environ = {**os.environ, "TETHER_WEB_LOOP": "trio"}
    command = [sys.executable, "-m", "config.web", "config.asgi:application"]
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "TETHER_WEB_LOOP must be one of uvloop, asyncio, not 'trio'" in done.stderr


def test_an_unknown_worker_loop_stops_the_worker_at_start_saying_what_is_allowed(tmp_path):
    environ = {**os.environ, "TETHER_WORKER_LOOP": "gevent", "TETHER_DATA_DIR": str(tmp_path)}
    environ.pop("DATABASE_URL", None)
    command = [sys.executable, "manage.py", "terminal_worker", "--http", ""]
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "TETHER_WORKER_LOOP must be one of uvloop, asyncio, not 'gevent'" in done.stderr


def test_embedded_sqlite_writers_wait_for_each_other_instead_of_failing(tmp_path, django_db_blocker, monkeypatch):
    """`make run`'s SQLite, written by the web process, its worker and the management commands at once:
    a transaction that read before it wrote failed at once with "database is locked" while another
    writer waited to commit (seen: opening a terminal from `manage.py shell` beside a running
    `tether_serve`). Every transaction takes the write lock when it begins, so writers queue instead."""
    import threading

    from django.db import connections, transaction
    from django.db.utils import ConnectionHandler

    config = env.database_from_url(f"sqlite:///{tmp_path / 'tether.sqlite3'}")
    config["OPTIONS"]["timeout"] = 5
    configured = ConnectionHandler({"default": config}).settings["default"]
    for alias in ("first", "second"):  # two connections of their own, to a file of their own
        monkeypatch.setitem(connections.settings, alias, dict(configured))
    failures: list[BaseException] = []
    reading = threading.Event()

    def other_writer():
        try:
            reading.wait(5)
            with transaction.atomic(using="second"), connections["second"].cursor() as cursor:
                cursor.execute("INSERT INTO rows VALUES (2)")
        except BaseException as error:
            failures.append(error)
        finally:
            connections["second"].close()

    with django_db_blocker.unblock():
        first = connections["first"]
        try:
            with first.cursor() as cursor:
                cursor.execute("CREATE TABLE rows (n INTEGER)")
            thread = threading.Thread(target=other_writer)
            thread.start()
            try:
                with transaction.atomic(using="first"), first.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM rows")
                    reading.set()
                    time.sleep(0.5)  # the other writer has begun and waits to commit
                    cursor.execute("INSERT INTO rows VALUES (1)")
            finally:
                thread.join(10)
            with first.cursor() as cursor:
                cursor.execute("SELECT n FROM rows ORDER BY n")
                assert [n for (n,) in cursor.fetchall()] == [1, 2]
        finally:
            first.close()
            del connections["first"]
    assert failures == []
