"""Shared fixtures. Every test gets its own MGPU_CLOUD_HOME, so nothing touches ~/.mgpu-cloud."""

from __future__ import annotations

import gc
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/fake_nodes.py and friends
# pytest keeps the test modules it rewrites (and the helpers they import) as bytecode in
# __pycache__ only where the interpreter may write bytecode. On machines with
# PYTHONDONTWRITEBYTECODE=1 (these) every process that collects (each xdist worker) rewrote and
# compiled every test module again on every run: 7.3 CPU-s each, 3.1 with the bytecode kept
# (`pytest --collect-only`, second run; a fresh clone gains nothing, its workers collect at
# once). This process only: what the tests start keeps the machine's setting. Writing is
# atomic (pytest: a temporary file, then a rename), so workers and concurrent runs may share a
# folder; where it cannot write, pytest goes on without.
sys.dont_write_bytecode = False

import rewritelock  # noqa: E402 - after the sys.path line above

rewritelock.install()  # one worker rewrites each test module, the others read its copy

ROOT = Path(__file__).resolve().parent.parent
import engine  # noqa: E402 - after the sys.path line above
import timekit  # noqa: E402
from kit import IN_CI  # noqa: E402

SESSION: dict[str, float] = {}
LOADGROUP_BROKEN = ("--dist loadgroup is not grouping tests marked xdist_group: this pytest and "
                    "pytest-xdist disagree on node ids (pytest-xdist#1386; pyproject.toml pins "
                    "pytest below 9.2 for it)")

# The tests' mean times in earlier runs (benchmarks/test_time.py --durations-out): the order
# the workers take them in (pytest_collection_modifyitems); a test not in it counts 1 s.
DURATIONS: dict[str, float] = json.loads((ROOT / "tests" / "durations.json").read_text())

pytest_plugins = ["storekit"]  # object stores and a webhook receiver (issue 18)

# A test run started in the background by a non-interactive shell (`make test &`, nohup, a CI
# step in some runners) has SIGINT ignored, and an ignored signal stays ignored across exec:
# the CLI processes the Ctrl-C tests start would never see their Ctrl-C. A terminal's default
# (Python's handler here; a child starts with SIG_DFL again) for this process and its children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _engine_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """A `serial` test (it measures the machine's speed: CPU ratios between nodes, a stall
    timeout) runs while no other test of this run uses the engine; engine tests share the
    engine with each other (xdist workers). A lock file of this run (tests/engine.py)."""
    serial = request.node.get_closest_marker("serial") is not None
    if not serial and not _on_engine(request.node):
        yield
        return
    with engine.engine_lock(exclusive=serial):
        yield


@pytest.fixture(scope="session", autouse=True)
def _children_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What the tests start keeps its temporary files in this run's folder, which pytest
    removes (it keeps the last 3 runs): torchrun's agent makes /tmp/torchelastic_* for every
    job and never removes it (torch.distributed.elastic's DefaultLogsSpecs without --log-dir),
    35-75 left per run by the tests that run torchrun here. This process keeps its own
    (tempfile cached /tmp when pytest made its base folder)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmp")))
        yield


@pytest.fixture(autouse=True)
def mgpu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "mgpu-home"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(home))
    return home


def docker_available() -> tuple[bool, str]:
    try:
        import docker

        docker.from_env(timeout=30).ping()
        return True, ""
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """A reachable Docker engine: required in CI (fails, never skips), skipped elsewhere."""
    ok, why = docker_available()
    if not ok:
        if IN_CI:
            pytest.fail(f"CI=true but the Docker engine is not reachable: {why}")
        pytest.skip(f"no Docker engine: {why}")
    yield


def _main_process(config: pytest.Config) -> bool:
    """The process that runs the session (not an xdist worker)."""
    return not hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests in `_start_order`, the longest first within it (a group: its tests' times
    together, tests/durations.json; stable: a file's tests keep their order). xdist hands
    work out in this order (`--no-loadscope-reorder`, the Makefile: its own reorder would put
    every group before every single test), so the long ones start early and short ones fill
    the gaps at the end, instead of one long test starting last and running alone."""
    seconds: dict[str, float] = {}
    for item in items:
        seconds[_group(item)] = seconds.get(_group(item), 0.0) + _took(item)
    items.sort(key=lambda item: (_start_order(item), -seconds[_group(item)],
                                 _took(item) if _start_order(item) == 0 else 0.0))


def _took(item: pytest.Item) -> float:
    return DURATIONS.get(item.nodeid.split("@")[0], 1.0)  # a worker's id ends in @GROUP


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return f"@{marker.args[0]}" if marker else item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test file's last test (its module fixtures gone): collect, then freeze what is
    left. A worker's heap grows from ~0.2 to ~0.9 M objects as the tests import the clients,
    service models and protobuf descriptors they use, and the collector's full passes walked all
    of it again and again: 33.5 CPU-s of the unit tests' 4 workers went to the collector, 15.9
    with this (gc.callbacks timing, one run each). Only what lives on past its file is frozen;
    the garbage of a test is collected as before."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """An xdist worker under `--dist loadgroup` whose grouped tests lost their group (the
    scheduler reads it from the node id's `@GROUP`; pytest-xdist#1386) would split a shared
    cluster's tests across workers, and a serial test outside the `serial` group would keep
    a worker of its own waiting for the engine: stop before anything runs."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items
            if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    alone = [i.nodeid for i in session.items
             if i.get_closest_marker("serial") and not i.nodeid.endswith("@serial")]
    why = LOADGROUP_BROKEN if lost else (
        f'mark these serial tests xdist_group("serial") too: {alone}' if alone else "")
    if why:
        print(f"\n{why}", file=sys.__stderr__)  # a worker's exit is not shown
        pytest.exit(why, returncode=3)


def _start_order(item: pytest.Item) -> int:
    """0: the `serial` tests, one group, first: they need the engine to be theirs alone, and
    at the start it is (at the end they waited for the last engine tests, then ran alone);
    the shortest first: the tests beside them run out meanwhile, and the last (test_goodput's
    slowed node, four ranks computing) then keeps the machine busy by itself, where a test
    that mostly waits (test_recovery's stall) left it half idle (run 40: 40 s at ~50%);
    1: the tests that do not use the engine: they keep the other workers busy meanwhile;
    2: long scenarios (`slow`) and groups sharing one cluster (an xdist_group runs as one
    unit); 3: the other tests on the engine, short ones that fill the gaps at the end.
    Within each, the longest first (pytest_collection_modifyitems)."""
    if item.get_closest_marker("serial"):
        return 0
    if not _on_engine(item):
        return 1
    return 2 if item.get_closest_marker("slow") or item.get_closest_marker("xdist_group") else 3


def _on_engine(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("docker")) or "node_image" in getattr(
        item, "fixturenames", ())


def pytest_sessionstart(session: pytest.Session) -> None:
    """This run's lease, then what killed runs left on the engine (tests/engine.py): the
    engine is shared by everything on the machine (two clones, CI and a developer), so only
    objects of runs whose main process is gone are removed, never a live run's or a
    developer's own clusters."""
    SESSION["start"] = time.monotonic()
    if not _main_process(session.config):
        return
    engine.take_lease()
    if docker_available()[0]:
        engine.sweep_killed_runs()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What this run's tests left on the engine despite their own cleanup (each test asserts
    it left nothing: this only keeps a failed run from leaving containers running)."""
    if not _main_process(session.config):
        return
    if docker_available()[0]:
        engine.sweep([engine.RUN], log=lambda m: print(m.replace("a killed", "this")))
    engine.drop_lease()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Where the time went, by folder, after every run (issue 45): the sum of the tests'
    setup + call + teardown times per folder, and the whole session's wall time."""
    if not _main_process(config):
        return
    folders = timekit.by_folder(terminalreporter.stats.values())
    if not folders:
        return
    terminalreporter.write_sep("=", "test time by folder")
    for line in timekit.table(folders, time.monotonic() - SESSION["start"]):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def node_image(docker_engine: None) -> str:
    """The node image, built once (cached by tag across runs)."""
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions

    return ensure_node_image(DockerOptions(), log=print)
