"""Deprecated: the broker commands live in ``leaseq.cli.broker`` and run as ``leaseq dispatch``
and ``leaseq rabbitmq …``. ``python -m leaseq.delivery.cli COMMAND`` still runs ``dispatch``,
``consume``, ``topology``, ``quarantine`` and ``republish`` for scripts written against it."""

from __future__ import annotations

import click

from leaseq.cli.broker import dispatch, rabbitmq

__all__ = ["dispatch", "rabbitmq"]

if __name__ == "__main__":
    click.CommandCollection(sources=[click.Group(commands=[dispatch]), rabbitmq])()
