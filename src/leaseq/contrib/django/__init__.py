"""leaseq for Django: ``pip install 'leaseq[django]'``, add ``"leaseq.contrib.django"`` to
``INSTALLED_APPS``, and make the App's store Django's own connection::

    # myproject/jobs.py
    app = leaseq.App(url="django://default")

    @app.task
    def send_welcome(user_id: int) -> None: ...

    # a view
    with transaction.atomic():
        user = User.objects.create(...)
        send_welcome.enqueue(user.id)   # commits or rolls back with the user row

Parts: the ``django://ALIAS`` store (``store``), the worker (``manage.py leaseq_worker``,
Django's connections cleaned up around every job), ``manage.py leaseq_migrate``, the tables in the
app's Django migration, a django-tasks backend (``tasks.LeaseqBackend``) and the test helper
``testing.run_jobs``. Settings: ``LEASEQ_APP`` and ``LEASEQ_URL`` (``settings``).

Async views: Django has no async database connection, so a transaction lives on Django's
sync thread. Put the transaction and the enqueue in one function run there::

    @sync_to_async(thread_sensitive=True)
    def place_order(data):
        with transaction.atomic():
            order = Order.objects.create(**data)
            ship.enqueue(order.id)

``await task.aenqueue(...)`` on a ``django://`` store runs on that same thread (no
``connection=``), in autocommit, like Django's own async ORM calls.
"""
