"""``App.from_ref("module:attr")``: the App a worker command names."""

from __future__ import annotations

import re
import sys
import types

import pytest

import leaseq
from leaseq.supervisor import load_app


@pytest.fixture
def tasks_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("fromref_tasks")
    module.app = leaseq.App()  # type: ignore[attr-defined]
    module.nested = types.SimpleNamespace(app=module.app)  # type: ignore[attr-defined]
    module.not_an_app = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fromref_tasks", module)
    return module


def test_finds_the_app_by_module_and_attribute(tasks_module: types.ModuleType) -> None:
    assert leaseq.App.from_ref("fromref_tasks:app") is tasks_module.app
    assert leaseq.App.from_ref("fromref_tasks:nested.app") is tasks_module.app


@pytest.mark.parametrize(("ref", "message"), [
    ("fromref_tasks", "expected MODULE:APP"),
    (":app", "expected MODULE:APP"),
    ("no_such_module_xyz:app", "cannot import module"),
    ("fromref_tasks:not_an_app", "is not a leaseq.App (got int)"),
    ("fromref_tasks:missing",
     "cannot find 'fromref_tasks:missing': module 'fromref_tasks' has no attribute 'missing'"),
    ("fromref_tasks:app.missing",
     "cannot find 'fromref_tasks:app.missing': 'fromref_tasks:app' has no attribute 'missing'"),
])
def test_a_bad_reference_is_invalid_input(tasks_module: types.ModuleType, ref: str,
                                          message: str) -> None:
    with pytest.raises(leaseq.InvalidInput, match=re.escape(message)):
        leaseq.App.from_ref(ref)


def test_the_old_load_app_still_works_and_says_it_is_deprecated(
    tasks_module: types.ModuleType
) -> None:
    with pytest.deprecated_call():
        assert load_app("fromref_tasks:app") is tasks_module.app
