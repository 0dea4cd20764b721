"""The architecture, checked: each layer imports only the layers below it, and no module
imports itself back through others (docs/ARCHITECTURE.md, "Layers").

Every `import` counts: at module level, inside functions, and under `if TYPE_CHECKING:` (a
type-only import is still a dependency for the reader). The registries of
provision/model/registry.py name providers and launchers by dotted path and load them on first
use; a string is not an import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("layers")  # one worker builds the import graph, once
# top to bottom; a module may import its own layer and the layers below it
LAYERS = ("cli", "operations", "job", "cluster", "nodes", "model")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` (module `name`) imports, resolved to known module names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) - {name} for name, path in files.items()}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "provision" and parts[1] in LAYERS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer (or of remote/ into provision/ and back)."""
    bad = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module)
        for dep in sorted(deps):
            if module.startswith("remote") and dep.startswith("provision"):
                bad.append(f"{module} -> {dep} (remote/ must not import provision/)")
            theirs = layer_of(dep)
            if mine and theirs and LAYERS.index(theirs) < LAYERS.index(mine):
                bad.append(f"{module} ({mine}) -> {dep} ({theirs})")
    return bad


PROVIDERS = "provision.cluster.providers"


def provider_of(module: str, folders: set[str]) -> str | None:
    """The provider folder a module belongs to (None: not inside one)."""
    parts = module.split(".")
    inside = module.startswith(PROVIDERS + ".") and len(parts) > 3 and parts[3] in folders
    return parts[3] if inside else None


def cross_provider_imports(graph: dict[str, set[str]], folders: set[str]) -> list[str]:
    """Every import of one provider's modules by another provider (what they share lives in
    a neutral module: provision/cluster/providers/*.py, provision/nodes/, provision/model/)."""
    bad = []
    for module, deps in sorted(graph.items()):
        mine = provider_of(module, folders)
        for dep in sorted(deps):
            theirs = provider_of(dep, folders)
            if mine and theirs and theirs != mine:
                bad.append(f"{module} ({mine}) -> {dep} ({theirs})")
    return bad


MANAGED = "provision.job.managed"


def folder_edges(graph: dict[str, set[str]], inner: str, outer: str) -> dict[str, list[str]]:
    """The imports between package `inner` and the rest of `outer` (its parent), by
    direction: {"down": outer's modules importing inner's, "up": inner's importing outer's}."""
    def side(module: str) -> str | None:
        if module == inner or module.startswith(inner + "."):
            return "inner"
        if module == outer or module.startswith(outer + "."):
            return "outer"
        return None

    edges: dict[str, list[str]] = {"down": [], "up": []}
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            pair = (side(module), side(dep))
            if pair == ("outer", "inner"):
                edges["down"].append(f"{module} -> {dep}")
            elif pair == ("inner", "outer"):
                edges["up"].append(f"{module} -> {dep}")
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """The project's import graph, made when a test of this file first runs, not when the file
    is collected: every test worker collects every file, and parsing each module took 0.85 s
    of each worker's collection."""
    return import_graph(ROOT, ["provision", "remote"])


FOLDERS = {p.parent.name for p in (ROOT / "provision/cluster/providers").glob("*/__init__.py")}


def test_top_level_packages_are_the_layers() -> None:
    tops = {p.name for p in (ROOT / "provision").iterdir()
            if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(LAYERS)
    loose = sorted(p.name for p in (ROOT / "provision").glob("*.py") if p.name != "__init__.py")
    assert loose == [], "every module belongs to a layer's package"


def test_each_layer_imports_only_layers_below_it(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_providers_import_no_other_provider_s_modules(graph: dict[str, set[str]]) -> None:
    assert {"docker", "aws", "gcp", "ssh", "slurm"} <= FOLDERS
    assert cross_provider_imports(graph, FOLDERS) == []


def test_no_import_circles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_job_and_job_managed_form_no_loop(graph: dict[str, set[str]]) -> None:
    """job/managed/ (the store, the controller, the choice of supervision) sits on top of the
    rest of job/ (the lifecycle, the supervisions it can run alone): managed imports the
    lifecycle, never the other way, so the two folders form no loop in either direction."""
    edges = folder_edges(graph, MANAGED, "provision.job")
    assert edges["up"], "managed/ runs the attached supervision's code (supervisor.py)"
    assert edges["down"] == [], "job/ outside managed/ imports managed/"


# The modules of each kind of job record: this machine's (read over SSH) and a managed run's
# store. Outside job/ they are read through the one interface (provision/job/jobrecords.py).
RECORD_KINDS = {"local": {"provision.model.jobstore", "provision.job.jobs"},
                "store": {"provision.job.managed.records", "provision.job.managed.client"}}


def kind_branching(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside job/ that reach both kinds of job record (directly, or through other
    modules outside job/): the ones that would branch on the kind. A layer's package itself
    (`provision.cli`, which mounts every command) and `__main__` only gather modules."""
    outside = {m for m in graph if m.startswith("provision.") and layer_of(m) != "job"
               and m.count(".") > 1 and not m.endswith(".__main__")}
    bad = []
    for module in sorted(outside):
        seen, todo = {module}, [module]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen and dep in outside:
                    seen.add(dep)
                    todo.append(dep)
        reached = set().union(*(graph.get(m, set()) for m in seen))
        kinds = sorted(k for k, mods in RECORD_KINDS.items() if reached & mods)
        if len(kinds) > 1:
            bad.append(f"{module} reaches {' and '.join(kinds)} records")
    return bad


def test_no_module_outside_job_branches_on_the_record_kind(graph: dict[str, set[str]]) -> None:
    assert kind_branching(graph) == []


def test_the_checks_can_fail(graph: dict[str, set[str]]) -> None:
    """A wrong-direction import and a circle are reported (so the two tests above can fail)."""
    graph = {k: set(v) for k, v in graph.items()}
    graph["provision.model.spec"].add("provision.cluster.providers")
    assert upward_imports(graph) == [
        "provision.model.spec (model) -> provision.cluster.providers (cluster)"]
    graph["provision.nodes.layout"].add("provision.nodes.group")
    assert ["provision.nodes.group", "provision.nodes.layout"] in cycles(graph)
    graph["provision.cluster.providers.slurm.plan"].add("provision.cluster.providers.ssh.hosts")
    graph["provision.cluster.providers.slurm.plan"].add("provision.cluster.providers.contract")
    assert cross_provider_imports(graph, FOLDERS) == [
        "provision.cluster.providers.slurm.plan (slurm) -> provision.cluster.providers.ssh.hosts"
        " (ssh)"]
    graph["provision.operations.dashboard.joblogs"].add("provision.job.managed.records")
    assert ("provision.operations.dashboard.joblogs reaches local and store records"
            in kind_branching(graph))
    graph["provision.job.lifecycle"].add("provision.job.managed.client")
    assert folder_edges(graph, MANAGED, "provision.job")["down"] == [
        "provision.job.lifecycle -> provision.job.managed.client"]


def test_an_added_wrong_import_is_found(tmp_path: Path) -> None:
    """The same check over real files: a model module importing the job layer fails it."""
    pkg = tmp_path / "provision"
    for layer in ("model", "job"):
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "job" / "launch.py").write_text("from provision.model import spec\n")
    (pkg / "model" / "spec.py").write_text(
        "def f() -> None:\n    from provision.job.launch import x  # noqa\n")
    graph = import_graph(tmp_path, ["provision"])
    assert upward_imports(graph) == ["provision.model.spec (model) -> provision.job.launch (job)"]
    assert cycles(graph) == [["provision.job.launch", "provision.model.spec"]]
