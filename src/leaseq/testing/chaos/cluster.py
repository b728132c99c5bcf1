"""A throwaway PostgreSQL cluster for a scenario (never the shared server): ``initdb`` and
``pg_ctl`` in a temporary folder, on a free port, as the ``postgres`` user when run as root
(``initdb`` refuses root), stopped and removed by the scenario's cleanup."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from leaseq.testing.chaos.measure import free_port
from leaseq.testing.chaos.run import Run, Skip


class Cluster:
    def __init__(self, folder: str, port: int, listen: Sequence[str]):
        self.folder, self.port = folder, port
        self.data, self.log = os.path.join(folder, "data"), os.path.join(folder, "log")
        self.options = (f"-p {port} -k {folder} -c listen_addresses={','.join(listen)}")

    @classmethod
    def start(cls, r: Run, listen: Sequence[str] = ("127.0.0.1",),
              trust: Sequence[str] = ()) -> Cluster:
        """Start a cluster listening on ``listen``; ``trust`` adds networks (CIDR) allowed to
        connect without a password. ``Skip`` when it cannot be had."""
        for tool in ("initdb", "pg_ctl"):
            if shutil.which(tool) is None:
                raise Skip(f"{tool} is not on PATH: cannot start a throwaway PostgreSQL cluster")
        folder = tempfile.mkdtemp(prefix="leaseq-chaos-pg-")
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        cluster = cls(folder, free_port(), listen)
        try:
            as_owner(["initdb", "-D", cluster.data, "-U", "postgres", "--auth=trust", "-E",
                      "UTF8", "--no-sync"])
            with open(os.path.join(cluster.data, "pg_hba.conf"), "a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in trust)
            cluster.pg_ctl("start", "-o", cluster.options)
        except (subprocess.SubprocessError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise Skip(f"cannot start a throwaway PostgreSQL cluster: {exc}") from None
        r.on_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        r.on_cleanup(lambda: cluster.pg_ctl("stop", "-m", "immediate"))
        return cluster

    def url(self, host: str, **options: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"postgresql://postgres@{host}:{self.port}/postgres" + (f"?{query}" if query
                                                                       else "")

    def pg_ctl(self, *args: str) -> None:
        as_owner(["pg_ctl", "-D", self.data, "-w", "-t", "60", "-l", self.log, *args])


def as_owner(command: list[str]) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
