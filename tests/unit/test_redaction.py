"""redaction.py: database passwords never shown, however malformed the URL."""

from __future__ import annotations

import logging
import sys

import pytest

from pgdurable import redaction
from pgdurable.errors import ConfigurationError


@pytest.fixture(autouse=True)
def fresh_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_secrets", set())


@pytest.mark.parametrize(("text", "expected"), [
    ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("failed: postgres://u:p%40ss@h/d here", "failed: postgres://u:***@h/d here"),
    ("postgresql://u:pa@ss@host/db", "postgresql://u:***@host/db"),  # an unescaped @ in the password
    ("host=db password=hunter22 user=u", "host=db password=*** user=u"),
    ("host=db password='quoted pass' user=u", "host=db password=*** user=u"),
    ("postgresql://h/db?user=u&password=topsecret&sslmode=require",
     "postgresql://h/db?user=u&password=***&sslmode=require"),
    ("PASSWORD = abc", "PASSWORD = ***"),
    ("postgresql://nopassword@host/db", "postgresql://nopassword@host/db"),
    ("", ""),
])
def test_redact_patterns(text: str, expected: str) -> None:
    assert redaction.redact(text) == expected


def test_redact_with_the_conninfo_removes_its_password_anywhere() -> None:
    conninfo = "postgresql://app:Tr0ub4dor@db/x"
    assert redaction.redact("libpq said: Tr0ub4dor is wrong", conninfo) == "libpq said: *** is wrong"


def test_remembered_passwords_are_redacted_everywhere() -> None:
    redaction.remember("postgresql://app:correct-horse@db/x")
    assert redaction.redact("oops correct-horse leaked") == "oops *** leaked"
    redaction.remember("postgresql://app:ab@db/x")  # too short to redact blindly
    assert redaction.redact("about a cab") == "about a cab"


def test_percent_encoded_password_is_redacted_decoded_too() -> None:
    redaction.remember("postgresql://app:p%40ssw0rd@db/x")
    assert redaction.redact("p@ssw0rd and p%40ssw0rd") == "*** and ***"


@pytest.mark.parametrize("url", ["postgresql://u:hunter22@db:99999/x", "postgresql://u:hunter22@db:port/x"])
def test_bad_port(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        redaction.check_database_url(url)
    assert "hunter22" not in str(caught.value)
    assert "***" in str(caught.value)


def test_unescaped_at_in_host() -> None:
    with pytest.raises(ConfigurationError, match="written %40") as caught:
        redaction.check_database_url("host=a@b password=hunter22")
    assert "hunter22" not in str(caught.value)


def test_malformed_url() -> None:
    with pytest.raises(ConfigurationError, match="malformed") as caught:
        redaction.check_database_url("postgresql://u:hunter22@db/x?bogus_option=1")
    assert "hunter22" not in str(caught.value)


def test_good_url_is_returned_and_remembered() -> None:
    url = "postgresql://u:hunter22@db:5432/x"
    assert redaction.check_database_url(url) == url
    assert redaction.redact("hunter22") == "***"


def test_describe_is_one_line_without_password() -> None:
    exc = RuntimeError("connection failed\n\nFATAL: password authentication failed for postgresql://u:hunter22@h/d\n")
    assert redaction.describe(exc) == "FATAL: password authentication failed for postgresql://u:***@h/d"
    assert redaction.describe(RuntimeError("")) == "RuntimeError"


def test_filter_cleans_messages_and_tracebacks() -> None:
    redaction.remember("postgresql://u:hunter22@h/d")
    try:
        raise RuntimeError("boom with hunter22")
    except RuntimeError:
        record = logging.LogRecord("pgdurable", logging.ERROR, __file__, 1, "url %s", ("postgresql://u:hunter22@h",),
                                   sys.exc_info())
    assert redaction.RedactingFilter().filter(record)
    assert record.getMessage() == "url postgresql://u:***@h"
    assert record.exc_text is not None and "hunter22" not in record.exc_text and "***" in record.exc_text


def test_filter_leaves_a_bad_format_string_to_logging() -> None:
    record = logging.LogRecord("pgdurable", logging.INFO, __file__, 1, "%d", ("not a number",), None)
    assert redaction.RedactingFilter().filter(record)
    assert record.msg == "%d"


def test_install_puts_the_filter_on_the_loggers() -> None:
    redaction.install()
    redaction.install()
    for name in redaction.LOGGERS:
        assert logging.getLogger(name).filters.count(redaction._FILTER) == 1
