"""Which of the broker's answers to a declare stop a dispatcher or consumer for good
(``TopologyError``) and which only end its session (it connects again)."""

from __future__ import annotations

from typing import Any

import pytest

pika_exceptions = pytest.importorskip("pika.exceptions", reason="leaseq[rabbitmq] is not installed")

from leaseq.delivery.connection import amqp_errors, is_fatal  # noqa: E402
from leaseq.delivery.topology import Topology  # noqa: E402
from leaseq.errors import TopologyError  # noqa: E402


class RefusingChannel:
    """A channel whose every declare the broker answers with ``code``."""

    def __init__(self, code: int, text: str):
        self.code, self.text, self.is_open = code, text, True

    def __getattr__(self, name: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> None:
            self.is_open = False
            raise pika_exceptions.ChannelClosedByBroker(self.code, self.text)
        return refused


@pytest.mark.parametrize("code", [403, 404, 406])
def test_a_refusal_a_new_session_would_meet_again_is_fatal(code: int) -> None:
    with pytest.raises(TopologyError) as raised:
        Topology("leaseq").declare(lambda: RefusingChannel(code, "REFUSED"), "mail",
                                   broker=(3, 10, 8))
    assert is_fatal(raised.value)


@pytest.mark.parametrize("code, text", [(541, "INTERNAL_ERROR"), (505, "UNEXPECTED_FRAME")])
def test_the_brokers_passing_trouble_ends_only_the_session(code: int, text: str) -> None:
    # It had become TopologyError, which stops the process, in a cluster's hiccup
    with pytest.raises(pika_exceptions.ChannelClosedByBroker) as raised:
        Topology("leaseq").declare(lambda: RefusingChannel(code, text), "mail",
                                   broker=(3, 10, 8))
    assert isinstance(raised.value, amqp_errors()) and not is_fatal(raised.value)
