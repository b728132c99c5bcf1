"""leaseq's benchmark harness (issue 8): ``python -m bench --quick``.

Each module is one piece: ``targets`` (a fresh database per run), ``systems`` (what a queue
under test must offer), ``adapters/`` (leaseq and the competitors), ``ceiling`` (the raw-SQL
limit), ``scenarios`` (what is measured), ``report`` (table and JSON), ``profile`` (cProfile of
leaseq's enqueue and drain). See docs/benchmarks.md.
"""
