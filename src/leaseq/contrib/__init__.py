"""Framework integrations: ``leaseq.contrib.django`` and ``leaseq.contrib.fastapi``."""
