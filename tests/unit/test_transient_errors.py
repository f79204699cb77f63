"""Which database errors a result wait retries (a lost connection, a cancelled statement, a Citus worker node
out of reach) rather than taking them for an answer."""

from __future__ import annotations

import psycopg
import psycopg.errors

from pgdurable.dberrors import transient


def test_the_clients_own_lost_connection_is_retried() -> None:
    assert transient(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert transient(psycopg.errors.AdminShutdown("terminating connection due to administrator command"))


def test_a_connection_lost_while_a_statement_runs_is_retried() -> None:
    # psycopg's class for an error result of libpq's own (no SQLSTATE): the server gone mid-statement
    assert transient(psycopg.DatabaseError("server closed the connection unexpectedly\n\tThis probably means "
                                           "the server terminated abnormally"))
    assert not transient(psycopg.DataError("invalid input syntax"))  # no SQLSTATE either, but about the data


def test_a_citus_worker_node_lost_by_the_coordinator_is_retried() -> None:
    # what a result wait got while noderestart had a worker node down (tests/test_citus_chaos.py)
    assert transient(psycopg.errors.InternalError_("failure on connection marked as essential: "
                                                         "127.0.0.1:9732"))
    assert transient(psycopg.errors.InternalError_("connection to the remote node postgres@127.0.0.1:9731 "
                                                         "failed with the following error: Connection refused"))
    # the node stopped mid-statement (seen by a result wait in noderestart, in CI)
    assert transient(psycopg.errors.InternalError_(
        "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n"
        "\tbefore or while processing the request.\ninvalid socket\nCONTEXT:  while executing command on "
        "127.0.0.1:9732"))


def test_errors_about_the_statement_are_answers() -> None:
    assert not transient(psycopg.errors.InternalError_("could not find the bucket"))
    assert not transient(psycopg.errors.UndefinedTable('relation "workflow_executions" does not exist'))


def test_a_cancelled_statement_is_retried() -> None:
    assert transient(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
