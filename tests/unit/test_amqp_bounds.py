"""Every leaseq connection to RabbitMQ is bounded (issue 14): heartbeats find a partitioned
broker, a blocked connection is closed, connecting ends; the URL may set each bound itself."""

from __future__ import annotations

import pytest

pytest.importorskip("pika", reason="leaseq[rabbitmq] is not installed")

from leaseq.delivery.connection import CONNECTION_DEFAULTS, connection_parameters
from leaseq.errors import InvalidURL


def test_a_url_without_bounds_gets_leaseqs() -> None:
    params = connection_parameters("amqp://guest:guest@rabbit:5672/%2f", name="w1")
    assert params.heartbeat == 15
    assert params.blocked_connection_timeout == 60.0
    assert (params.socket_timeout, params.stack_timeout) == (10.0, 15.0)
    assert params.client_properties == {"connection_name": "w1"}
    assert set(CONNECTION_DEFAULTS) == {"heartbeat", "blocked_connection_timeout",
                                        "socket_timeout", "stack_timeout"}


def test_bounds_in_the_url_win() -> None:
    params = connection_parameters(
        "amqp://guest:guest@rabbit/%2f?heartbeat=4&blocked_connection_timeout=9"
        "&socket_timeout=2&stack_timeout=3")
    assert (params.heartbeat, params.blocked_connection_timeout) == (4, 9.0)
    assert (params.socket_timeout, params.stack_timeout) == (2.0, 3.0)


def test_an_unusable_url_is_refused_with_the_password_masked() -> None:
    with pytest.raises(InvalidURL) as raised:
        connection_parameters("amqp://guest:s3cret@rabbit/%2f?heartbeat=soon")
    assert "s3cret" not in str(raised.value)
