"""config.py: settings from arguments, then the environment, then defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgdurable.config import Settings, database_url_from_env, embedded_data_dir, schema_name
from pgdurable.errors import ConfigurationError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGDURABLE_DATABASE_URL", "DATABASE_URL", "PGDURABLE_SCHEMA", "PGDURABLE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_database_url_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert database_url_from_env() is None
    monkeypatch.setenv("DATABASE_URL", "postgresql://generic")
    assert database_url_from_env() == "postgresql://generic"
    monkeypatch.setenv("PGDURABLE_DATABASE_URL", "postgresql://ours")
    assert database_url_from_env() == "postgresql://ours"
    monkeypatch.setenv("PGDURABLE_DATABASE_URL", "")
    assert database_url_from_env() == "postgresql://generic"
    monkeypatch.setenv("DATABASE_URL", "")
    assert database_url_from_env() is None


def test_schema_name_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert schema_name(None) == "pgdurable"
    monkeypatch.setenv("PGDURABLE_SCHEMA", "from_env")
    assert schema_name(None) == "from_env"
    assert schema_name("explicit_1") == "explicit_1"


@pytest.mark.parametrize("name", ["a", "_x", "abc_123", "a" * 41])
def test_schema_names_accepted(name: str) -> None:
    assert schema_name(name) == name


@pytest.mark.parametrize("name", ["Upper", "1abc", "has-dash", "has space", "a" * 42, "quote\"d", "semi;colon",
                                  "é", "a\nb",
                                  "a\n"])
def test_schema_names_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="lowercase SQL identifier"):
        schema_name(name)


def test_schema_name_from_env_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGDURABLE_SCHEMA", "Bad-Name")
    with pytest.raises(ConfigurationError):
        schema_name(None)


def test_embedded_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = embedded_data_dir()
    assert default.name == "pg18" and "pgdurable" in str(default)
    monkeypatch.setenv("PGDURABLE_DATA_DIR", str(tmp_path / "pg"))
    assert embedded_data_dir() == tmp_path / "pg"
    monkeypatch.setenv("PGDURABLE_DATA_DIR", "~/pgd")
    assert embedded_data_dir() == Path.home() / "pgd"


def test_settings_defaults_and_heartbeat() -> None:
    settings = Settings()
    assert settings.lease_seconds == 30.0
    assert settings.heartbeat_seconds == 10.0
    assert Settings(lease_seconds=3).heartbeat_seconds == 1.0


@pytest.mark.parametrize("kwargs", [
    {"lease_seconds": 0}, {"poll_seconds": -1}, {"sweep_seconds": 0}, {"max_recoveries": -1},
    {"max_payload_bytes": 1023}, {"retention_seconds": -1}, {"retention_batch_size": 0},
    {"adopt_after_seconds": 0}, {"adopt_after_seconds": 10.0},  # not above the heartbeat (10 s by default)
    {"lease_seconds": 300},  # its heartbeat (100 s) would outlast the default adoption grace (60 s)
])
def test_settings_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_settings_accepted_edges() -> None:
    assert Settings(max_recoveries=0, max_payload_bytes=1024, retention_seconds=0, retention_batch_size=1,
                    unknown_workflow_grace_seconds=None).max_payload_bytes == 1024
    assert Settings().adopt_after_seconds == 60.0
    assert Settings(adopt_after_seconds=None).adopt_after_seconds is None  # strict per-version mode
    assert Settings(lease_seconds=300, adopt_after_seconds=None).lease_seconds == 300
    assert Settings(lease_seconds=3, adopt_after_seconds=1.5).adopt_after_seconds == 1.5


@pytest.mark.parametrize("name", ["shutdown_grace_seconds", "shutdown_patience_seconds"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_shutdown_timings_must_be_finite_and_not_negative(name: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=f"{name} must be a number of seconds >= 0"):
        Settings(**{name: value})


@pytest.mark.parametrize("name", ["lease_seconds", "poll_seconds", "sweep_seconds"])
def test_nan_timings_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="must be positive"):
        Settings(**{name: float("nan")})
