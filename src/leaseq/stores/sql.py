"""Named SQL queries: ``.sql`` files split on ``-- name: NAME`` lines (as aiosql and River do)."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
#: ``{now}``, ``{event.claimed}``: a placeholder the loader must fill. A JSON or array literal
#: such as ``'{}'`` or ``'{a,b}'`` is not one, nor is a quoted ``'{n}'``: the field of a
#: ``leaseq.journal`` template, which the query fills with ``replace``.
_BRACED = r"\{[a-z_]+(?:\.[a-z_]+)?\}"
_PLACEHOLDER = re.compile(rf"(?<!'){_BRACED}|{_BRACED}(?!')")


def load_queries(package: str, filename: str, **substitutions: str) -> dict[str, str]:
    """Read ``filename`` from ``package`` and return ``{name: sql}``.

    ``filename`` is one ``.sql`` file or a folder, whose ``*.sql`` files (one per topic) are
    read in name order as one set: a name defined in two of them is an error.
    ``{key}`` placeholders are replaced by ``substitutions`` (for example the store's clock
    expression), so each query's text stays whole in its file.
    """
    entry = resources.files(package).joinpath(filename)
    if entry.is_dir():
        files = sorted((f for f in entry.iterdir() if f.name.endswith(".sql")),
                       key=lambda f: f.name)
        labelled = [(f"{filename}/{file.name}", file) for file in files]
    else:
        labelled = [(filename, entry)]
    queries: dict[str, str] = {}
    for label, file in labelled:
        _add_queries(queries, label, file.read_text(encoding="utf-8"), substitutions)
    return queries


def _add_queries(queries: dict[str, str], label: str, text: str,
                 substitutions: dict[str, str]) -> None:
    """Add the named queries of one file's ``text`` to ``queries``; ``label`` names the file."""
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = _without_comment_lines(body).strip()
        for key, value in substitutions.items():
            sql = sql.replace("{" + key + "}", value)
        if left := _PLACEHOLDER.search(sql):
            raise ValueError(f"{label}: query {name!r} names {left[0]}, which nothing fills")
        if name in queries:
            raise ValueError(f"{label}: query {name!r} is defined twice")
        queries[name] = sql


def _without_comment_lines(body: str) -> str:
    """A query's text without its whole-line ``--`` comments: the comment that introduces the
    next query sits at the end of this one's part of the file, and a driver reads a
    placeholder inside a comment as its own (psycopg's ``%(name)s``: "query parameter
    missing")."""
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))


def migrations(package: str) -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` for each ``migrations/NNN_name.sql`` of ``package``, in order."""
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{3})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found)


def latest_migration(package: str) -> int:
    """The version of the last ``migrations/NNN_name.sql`` of ``package``: the schema this code
    expects."""
    return migrations(package)[-1][0]
