"""`make mutation`: mutmut over the trust-critical modules, each against its own fast tests.

    python scripts/mutation.py [SCOPE ...] [--list] [--max-children N]

Each scope (SCOPES below: the modules a promise of docs/security.md rests on, and the fast
tests that hold it) runs in a folder of its own, build/mutation/SCOPE/, where links to the
checkout and a pyproject.toml with its [tool.mutmut] section make mutmut (3.8) see only that
scope: `only_mutate` its files, `pytest_add_cli_args_test_selection` its tests; where a scope
is a few functions of a bigger module, only their mutants run (mutmut's name patterns).
mutmut then runs, for each mutant, the tests among those that executed its function.

What it prints and writes (build/mutation/summary.json): per scope the mutants, how many the
tests killed, the score (killed / mutants), and every survivor by name, marked when
docs/mutation-survivors.md explains it as equivalent. It exits 1 when a survivor is not
explained there: each one is either killed by a new test or explained (issue 42).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutation"
EXPLAINED = ROOT / "docs" / "mutation-survivors.md"
LINKED = ("provision", "remote", "tests", "templates", "examples", "inventories", "docs",
          "Dockerfile")
COPIED = [e for e in LINKED if e not in ("provision", "remote", "tests")]  # beside the mutants


@dataclass(frozen=True)
class Scope:
    files: list[str]
    tests: list[str]
    functions: list[str] = field(default_factory=list)  # mutant name patterns (default: all)
    select: str = ""  # a pytest -k expression: which tests of those files (the fast ones)


AWS = "provision.cluster.providers.aws.teardown.xǁTeardownǁ"
GCP = "provision.cluster.providers.gcp.teardown.x_"
K8S = "provision.cluster.providers.k8s.cleanup.x_"
SCOPES: dict[str, Scope] = {
    "storekeys": Scope(["remote/storekeys.py"],
                       ["tests/remote/test_store_keys.py", "tests/remote/test_store_key_rule.py",
                        "tests/managed/test_hostile_store.py"],
                       select="not s3 and not gcs"),
    "signing": Scope(["provision/job/managed/signing.py"],
                     ["tests/managed/test_sealed_control.py",
                      "tests/managed/test_hostile_store.py",
                      "tests/managed/test_adoption_logins.py"]),
    "logins": Scope(["provision/model/logins.py"],
                    ["tests/test_logins.py", "tests/test_inventory.py"]),
    "extraction": Scope(["provision/nodes/unpack.py"],
                        ["tests/test_unpack.py", "tests/test_unpack_edges.py"]),
    "deletion-docker": Scope(["provision/cluster/providers/docker/removal.py"],
                             ["tests/providers/docker/test_docker_unit.py",
                              "tests/providers/docker/test_docker_trust.py",
                              "tests/providers/docker/test_removal_edges.py"]),
    "deletion-aws": Scope(["provision/cluster/providers/aws/teardown.py"],
                          ["tests/providers/aws/test_aws_foreign.py",
                           "tests/providers/aws/test_aws_teardown_edges.py"],
                          functions=[f"{AWS}owned__mutmut_*", f"{AWS}refuse__mutmut_*"]),
    "deletion-gcp": Scope(["provision/cluster/providers/gcp/teardown.py"],
                          ["tests/providers/gcp/test_foreign.py",
                           "tests/providers/gcp/test_owner_edges.py"],
                          functions=[f"{GCP}description_owner__mutmut_*",
                                     f"{GCP}owner__mutmut_*"]),
    "deletion-k8s": Scope(["provision/cluster/providers/k8s/cleanup.py"],
                          ["tests/providers/k8s/test_k8s_cleanup.py"],
                          functions=[f"{K8S}delete_if_labelled__mutmut_*",
                                     f"{K8S}delete__mutmut_*", f"{K8S}read__mutmut_*",
                                     f"{K8S}delete_cluster__mutmut_*"]),
    "nodecreds": Scope(["provision/job/managed/nodecreds.py"],
                       ["tests/managed/test_node_credentials.py",
                        "tests/managed/test_node_credentials_edges.py",
                        "tests/managed/test_broad_credentials.py"]),
    # in-process (Starlette's TestClient): test_access.py's served dashboard runs in another
    # process, where mutmut sees no test reach the module
    "dashboard-security": Scope(["provision/operations/dashboard/security.py"],
                                ["tests/dashboard/test_web.py",
                                 "tests/dashboard/test_cookie_scope.py",
                                 "tests/dashboard/test_security_edges.py"],
                                select="token or origin or loopback or buttons or cookie "
                                       "or redirect or site or removed or head"),
}
RESULT = re.compile(r"^\s*(\S+): (.+)$")


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(name: str, scope: Scope) -> Path:
    """build/mutation/NAME: links to the checkout, and a pyproject.toml for mutmut."""
    here = BUILD / name
    if here.exists():
        shutil.rmtree(here)
    here.mkdir(parents=True)
    for entry in LINKED:
        (here / entry).symlink_to(ROOT / entry)
    selection = [*scope.tests, *(["-k", scope.select] if scope.select else [])]
    text = (ROOT / "pyproject.toml").read_text() + (
        "\n[tool.mutmut]\n"
        'source_paths = ["provision", "remote"]\n'
        f"only_mutate = {_toml_list(scope.files)}\n"
        f"also_copy = {_toml_list(COPIED)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(selection)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n')
    (here / "pyproject.toml").write_text(text)
    return here


def results(here: Path, mutmut: str) -> dict[str, str]:
    out = subprocess.run([mutmut, "results", "--all", "true"], cwd=here, capture_output=True,
                         text=True, check=True).stdout
    return {m.group(1): m.group(2).strip() for line in out.splitlines()
            if (m := RESULT.match(line))}


def explained() -> set[str]:
    """Mutant names docs/mutation-survivors.md explains (each on a line `- NAME: why`)."""
    if not EXPLAINED.exists():
        return set()
    return set(re.findall(r"^- `([^`]+)`", EXPLAINED.read_text(), re.MULTILINE))


def run_scope(name: str, scope: Scope, mutmut: str, children: int | None = None
              ) -> dict[str, object]:
    import fnmatch

    here = prepare(name, scope)
    with open(here / "mutmut.log", "w") as log:
        extra = ["--max-children", str(children)] if children else []
        subprocess.run([mutmut, "run", *extra, *scope.functions], cwd=here, stdout=log,
                       stderr=subprocess.STDOUT, check=False)
    if "failed to collect stats" in (here / "mutmut.log").read_text(errors="replace"):
        return {"files": scope.files, "tests": scope.tests, "mutants": 0, "killed": 0,
                "score": None, "survivors": {}, "failed": str(here / "mutmut.log")}
    got = results(here, mutmut)
    if scope.functions:
        got = {k: v for k, v in got.items()
               if any(fnmatch.fnmatch(k, p) for p in scope.functions)}
    killed = sum(1 for v in got.values() if v == "killed")
    survivors = sorted(k for k, v in got.items() if v != "killed")
    return {"files": scope.files, "tests": scope.tests, "mutants": len(got), "killed": killed,
            "score": round(killed / len(got), 3) if got else None,
            "survivors": {k: got[k] for k in survivors}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scopes", nargs="*", help=f"default: all ({', '.join(SCOPES)})")
    parser.add_argument("--list", action="store_true", help="print the scopes and exit")
    parser.add_argument("--max-children", type=int, metavar="N",
                        help="mutants tested at once (mutmut's default: one per CPU)")
    args = parser.parse_args(argv)
    if args.list:
        for name, scope in SCOPES.items():
            print(f"{name}: {', '.join(scope.files)} <- {', '.join(scope.tests)}")
        return 0
    unknown = [s for s in args.scopes if s not in SCOPES]
    if unknown:
        parser.error(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}")
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    known = explained()
    summary: dict[str, object] = {}
    unexplained: list[str] = []
    for name in args.scopes or list(SCOPES):
        missing = [f for f in SCOPES[name].files + SCOPES[name].tests if not (ROOT / f).exists()]
        if missing:
            print(f"{name}: skipped ({', '.join(missing)} not in this checkout)")
            continue
        got = run_scope(name, SCOPES[name], mutmut, args.max_children)
        summary[name] = got
        if got.get("failed"):
            print(f"{name}: its tests fail without a mutant: see {got['failed']}")
            unexplained.append(name)
            continue
        survivors = dict(got["survivors"])  # type: ignore[call-overload]
        print(f"{name}: {got['killed']}/{got['mutants']} killed, score {got['score']}")
        for mutant, status in survivors.items():
            mark = "equivalent (explained)" if mutant in known else "NOT EXPLAINED"
            print(f"  {status}: {mutant}  [{mark}]")
            if mutant not in known:
                unexplained.append(mutant)
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if unexplained:
        print(f"{len(unexplained)} survivor(s) neither killed nor explained in "
              f"{EXPLAINED.relative_to(ROOT)}: `mutmut show NAME` in build/mutation/SCOPE")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
