"""leaseq for FastAPI: ``pip install 'leaseq[fastapi]'``.

* ``lifespan(jobs, worker=...)`` opens the App's store when the server starts and closes it
  when it stops; with ``worker=WorkerConfig(...)`` (or ``True``) it also runs an embedded
  worker that stops with the app (stops claiming, lets in-flight jobs finish within the
  grace period, gives the rest back).
* ``queue_dependency(name)``: ``q: Queue = Depends(queue_dependency("mail"))`` in a path
  operation, then ``await q.aenqueue(...)``.
* ``jobs_router(jobs, tasks=[...], principal=current_user)``: the HTTP face of "accepted, job
  id" (``router``); a caller reads only its own jobs. ``new_job_id(principal)``: the id for a
  job a path operation of the app's own enqueues, for its caller to poll through the router.

::

    jobs = leaseq.App(url="postgresql://…")
    api = FastAPI(lifespan=lifespan(jobs))
    api.include_router(jobs_router(jobs, tasks=[send_mail], principal=current_user))
"""

from leaseq.contrib.fastapi.lifespan import lifespan, queue_dependency
from leaseq.contrib.fastapi.router import jobs_router, new_job_id

__all__ = ["jobs_router", "lifespan", "new_job_id", "queue_dependency"]
