"""Broker delivery (DESIGN.md §5). ``leaseq.delivery.rabbitmq`` is the entry point; it needs the
``leaseq[rabbitmq]`` extra (pika), which is imported only when a connection is opened."""
