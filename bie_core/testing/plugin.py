"""pytest plugin of bie-core (``pytest11`` entry point): the conformance kit.

``python -m pytest --pyargs bie_core.testing --bie-backend=NAME`` (or
``NAME1,NAME2``) runs the conformance items of each named backend (see
:mod:`bie_core.testing.conformance`) from any directory and prints an
op × backend coverage matrix at the end. Paths given on the command line are
collected as well; without any (plain ``pytest --bie-backend=NAME``), only the
kit runs, not the ``testpaths`` or the directory's tests. Inputs are fresh random on every run; the seed is printed
in the header and ``--bie-seed=N`` reproduces a run. ``--bie-device`` picks
the device (default: the first device type the backend serves that exists
here).
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

_STATE: dict = {}


def pytest_addoption(parser):
    g = parser.getgroup("bie", "bie conformance kit")
    g.addoption("--bie-backend", action="store", default=None,
                help="run the conformance kit for these backends (comma-separated)")
    g.addoption("--bie-seed", action="store", type=int, default=None,
                help="seed for the conformance inputs (default: fresh each run)")
    g.addoption("--bie-device", action="store", default=None,
                help="device for the conformance inputs (default: chosen from the backend's devices)")
    g.addoption("--bie-opcheck-cases", action="store", type=int, default=2,
                help="cases per op given to torch.library.opcheck (default 2)")


def _backends(config):
    raw = config.getoption("--bie-backend")
    return [b.strip() for b in raw.split(",") if b.strip()] if raw else []


def pytest_configure(config):
    if not _backends(config):
        return
    seed = config.getoption("--bie-seed")
    if seed is None:
        seed = int(os.environ.get("BIE_SEED", random.SystemRandom().randrange(2**31)))
    _STATE["seed"] = seed
    config.addinivalue_line("markers", "bie_conformance: an item of the bie conformance kit")


def pytest_report_header(config):
    names = _backends(config)
    if not names:
        return None
    return f"bie conformance: backends={','.join(names)} seed={_STATE['seed']} (reproduce with --bie-seed={_STATE['seed']})"


def _device_for(rec, requested):
    import torch
    if requested:
        return torch.device(requested)
    devs = rec.devices or ("cpu",)
    if "*" in devs or "cpu" in devs:
        return torch.device("cpu")
    for d in devs:
        if d == "cuda" and torch.cuda.is_available():
            return torch.device("cuda")
        if d == "mps" and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
    return torch.device(devs[0])


def pytest_ignore_collect(collection_path, config):
    # kit mode without paths on the command line: collect nothing but the kit
    # (the items are added below), rather than the ini's testpaths or the
    # whole directory tree
    if _backends(config) and getattr(config, "args_source", None) in (
            pytest.Config.ArgsSource.TESTPATHS, pytest.Config.ArgsSource.INVOCATION_DIR):
        return True
    return None


def pytest_collection_modifyitems(session, config, items):
    names = _backends(config)
    if not names:
        return
    module_path = Path(__file__).with_name("_conformance_tests.py")
    mod = pytest.Module.from_parent(session, path=module_path)
    new = []
    for node in mod.collect():
        new.extend(session.genitems(node))
    items.extend(new)


def pytest_generate_tests(metafunc):
    wanted = {"bie_kernel_case", "bie_op_case", "bie_backend_record", "bie_prepared_case"}
    if not wanted & set(metafunc.fixturenames):
        return
    from bie_core.plugins.registry import get_registry
    from bie_core.testing import conformance

    config = metafunc.config
    seed = _STATE["seed"]
    params, ids, op_params, op_ids, recs, prep = [], [], [], [], [], []
    n_opcheck = config.getoption("--bie-opcheck-cases")
    for name in _backends(config):
        rec = get_registry().record(name)
        if rec is None:
            raise pytest.UsageError(f"--bie-backend={name}: unknown backend; installed: "
                                    f"{sorted(get_registry().names())}")
        recs.append(rec)
        if not rec.ok:
            continue
        device = _device_for(rec, config.getoption("--bie-device"))
        _, kcs = conformance.plan(name, device, seed)
        for kc in kcs:
            params.append(kc)
            ids.append(kc.id)
        per_kernel = {}
        for kc in kcs:
            if kc.accepted and kc.kernel.prepare is not None and kc.op.weight_args \
                    and per_kernel.get(kc.kernel.qualname, 0) < 4 and kc.case.expect_error is None:
                per_kernel[kc.kernel.qualname] = per_kernel.get(kc.kernel.qualname, 0) + 1
                prep.append(kc)
        seen_ops = {}
        for kc in kcs:
            if kc.accepted and seen_ops.get(kc.op.name, 0) < n_opcheck and kc.case.expect_error is None:
                seen_ops[kc.op.name] = seen_ops.get(kc.op.name, 0) + 1
                op_params.append((name, kc))
                op_ids.append(f"{name}:{kc.op.name}::{kc.case.label}")
    if "bie_kernel_case" in metafunc.fixturenames:
        metafunc.parametrize("bie_kernel_case", params, ids=ids)
    if "bie_op_case" in metafunc.fixturenames:
        metafunc.parametrize("bie_op_case", op_params, ids=op_ids)
    if "bie_prepared_case" in metafunc.fixturenames:
        metafunc.parametrize("bie_prepared_case", prep, ids=[kc.id for kc in prep])
    if "bie_backend_record" in metafunc.fixturenames:
        # by name: the record is looked up when the test runs (a registry reset
        # between collection and run must not leave a stale record behind)
        metafunc.parametrize("bie_backend_record", [r.name for r in recs], ids=[r.name for r in recs])


@pytest.fixture
def bie_seed():
    return _STATE.get("seed", 0)


def pytest_runtest_logreport(report):
    if report.when != "call" or "bie_conformance" not in report.keywords:
        return
    key = getattr(report, "bie_key", None)
    if key is None:
        return
    from bie_core.testing.conformance import COVERAGE
    COVERAGE[key][("pass" if report.passed else "fail")] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    kc = getattr(item, "callspec", None)
    if kc is not None and "bie_kernel_case" in kc.params and item.originalname == "test_kernel":
        k = kc.params["bie_kernel_case"]
        if not hasattr(k, "kernel"):  # an empty parameter set (backend not loaded)
            return
        rep.bie_key = (k.op.name, k.kernel.backend, "matches" if k.accepted else "honesty")
        rep.keywords["bie_conformance"] = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = _backends(config)
    if not names:
        return
    from bie_core.ops import all_ops
    from bie_core.testing.conformance import COVERAGE, SHAPE_ONLY
    from bie_core.plugins.registry import get_registry

    tr = terminalreporter
    tr.section("bie conformance coverage (op x backend: cases passed/run [disclaimed cases checked])")
    width = max(len(o.name) for o in all_ops()) + 2
    tr.write_line("op".ljust(width) + "".join(n.ljust(26) for n in names))
    total_pass = total_run = 0
    for op in all_ops():
        row = op.name.ljust(width)
        for n in names:
            m = COVERAGE.get((op.name, n, "matches"), {})
            h = COVERAGE.get((op.name, n, "honesty"), {})
            run = m.get("pass", 0) + m.get("fail", 0)
            hr = h.get("pass", 0) + h.get("fail", 0)
            total_pass += m.get("pass", 0) + h.get("pass", 0)
            total_run += run + hr
            cell = "-" if not run and not hr else f"{m.get('pass', 0)}/{run}" + (f" [{h.get('pass', 0)}/{hr}]" if hr else "")
            row += cell.ljust(26)
        if op.name in SHAPE_ONLY:
            row += "(reference: no oracle, shape/dtype only)"
        tr.write_line(row)
    for n in names:
        rec = get_registry().record(n)
        if rec is not None and not rec.ok:
            tr.write_line(f"backend {n}: {rec.status}: {rec.cause} (no kernel checked)")
    tr.write_line(f"total: {total_pass}/{total_run} kernel-case checks passed; seed {_STATE.get('seed')}")
