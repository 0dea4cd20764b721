from __future__ import annotations

from pathlib import Path

import pytest

from provision.model.errors import SpecError
from provision.model.spec import (
    ClusterSpec,
    build_cluster_spec,
    build_job_spec,
    load_config_file,
    parse_env_pairs,
)

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


@pytest.mark.parametrize("name", ["a", "demo", "my-cluster-2", "x" * 40])
def test_valid_names(name: str) -> None:
    assert build_cluster_spec({}, {"name": name}).name == name


@pytest.mark.parametrize(
    "name", ["", "Demo", "-a", "a-", "a_b", "a.b", "1abc", "x" * 41, "a b", "a;rm"]
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(SpecError, match="invalid cluster name"):
        build_cluster_spec({}, {"name": name})


def test_yaml_and_flags_make_the_same_model(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        "name: demo\nprovider: aws\nnodes: 2\nssh_cidr: 203.0.113.7/32\n"
        "aws:\n  instance_type: p5.48xlarge\n  region: us-east-1\n"
    )
    from_file = build_cluster_spec(load_config_file(cfg), {})
    from_flags = build_cluster_spec({}, {
        "name": "demo", "provider": "aws", "nodes": 2, "ssh_cidr": "203.0.113.7/32",
        "aws": {"instance_type": "p5.48xlarge", "region": "us-east-1"},
    })
    assert from_file == from_flags
    assert isinstance(from_file, ClusterSpec)


def test_flags_override_file_and_keep_the_rest(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: demo\nnodes: 2\naws:\n  region: us-east-1\n  zone: us-east-1a\n")
    spec = build_cluster_spec(load_config_file(cfg), {"provider": "aws", "nodes": 4,
                                                       "aws": {"zone": "us-east-1b"}})
    assert (spec.nodes, spec.aws.region, spec.aws.zone) == (4, "us-east-1", "us-east-1b")


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: demo\nnodez: 2\n")
    with pytest.raises(SpecError, match="nodez: unknown setting"):
        build_cluster_spec(load_config_file(cfg), {})


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: demo\nnodes: [2\n")
    with pytest.raises(SpecError, match="not valid YAML at line"):
        load_config_file(cfg)


def test_yaml_must_be_a_mapping(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must hold a mapping"):
        load_config_file(cfg)


@pytest.mark.parametrize("nodes", [0, -1])
def test_nodes_at_least_one(nodes: int) -> None:
    with pytest.raises(SpecError, match="nodes"):
        build_cluster_spec({}, {"nodes": nodes})


def test_unknown_provider() -> None:
    with pytest.raises(SpecError, match="unknown provider 'azure'"):
        build_cluster_spec({}, {"provider": "azure"})


def test_options_for_another_provider_are_refused() -> None:
    with pytest.raises(SpecError, match="settings for provider 'aws'"):
        build_cluster_spec({}, {"provider": "docker", "aws": {"region": "us-east-1"}})


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "not-a-cidr", "300.1.1.1/32", "1.2.3.4/"])
def test_bad_cidr(cidr: str) -> None:
    with pytest.raises(SpecError, match="is not a CIDR"):
        build_cluster_spec({}, {"ssh_cidr": cidr})


def test_cidr_is_normalized() -> None:
    assert build_cluster_spec({}, {"ssh_cidr": "203.0.113.7"}).ssh_cidr == "203.0.113.7/32"


def test_generated_name_is_valid() -> None:
    spec = build_cluster_spec({}, {})
    assert spec.name.startswith("mgpu-")


def test_job_script_must_exist(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        build_job_spec({}, {"script": str(tmp_path / "missing.py")})


def test_job_paths() -> None:
    job = build_job_spec({}, {"script": EXAMPLE, "args": ["--lr", "3e-4"]})
    assert job.script_in_workdir == "train_ddp.py"
    assert job.local_workdir == Path(EXAMPLE).parent
    assert job.args == ["--lr", "3e-4"]


def test_job_nproc() -> None:
    assert build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "4"}).nproc_per_node == 4
    assert build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "gpu"}).nproc_per_node == "gpu"
    with pytest.raises(SpecError, match="nproc_per_node"):
        build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "many"})


def test_job_unknown_launcher() -> None:
    with pytest.raises(SpecError, match="launcher"):
        build_job_spec({}, {"script": EXAMPLE, "launcher": "mpirun"})


def test_env_pairs_and_file(tmp_path: Path) -> None:
    f = tmp_path / ".env"
    f.write_text("# comment\nexport A=1\nB='two words'\n")
    assert parse_env_pairs(["B=3", "C=x=y"], str(f)) == {"A": "1", "B": "3", "C": "x=y"}
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        parse_env_pairs(["novalue"])


def test_bad_env_name() -> None:
    with pytest.raises(SpecError, match="invalid environment variable name"):
        build_job_spec({}, {"script": EXAMPLE, "env": {"A B": "1"}})


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate"])
@pytest.mark.parametrize("value,named", [("a\nb", "a newline"), ("a\rb", "a carriage return"),
                                         ("trailing\n", "a newline"), ("a\0b", "a NUL byte")])
def test_env_values_that_break_a_line_are_refused(launcher: str, value: str, named: str) -> None:
    """Every launcher hands values on as lines (DeepSpeed's env file, docker's --env-file): a
    line break is refused with the spec, before anything is made, naming the variable."""
    with pytest.raises(SpecError, match=f"the value of TOKEN contains {named}.*base64"):
        build_job_spec({}, {"script": EXAMPLE, "launcher": launcher,
                            "env": parse_env_pairs([f"TOKEN={value}"])})


def test_env_values_on_one_line_pass_as_they_are() -> None:
    hostile = {"A": "; touch /tmp/pwned", "B": " two  spaces ", "C": "it's \"q\" $(x) `y` \\",
               "D": "%n %h %%", "E": "", "F": "tab\there"}
    assert build_job_spec({}, {"script": EXAMPLE, "env": hostile}).env == hostile


def test_a_line_break_in_env_is_refused_by_the_cli_before_the_cluster_is_looked_up(
        tmp_path: Path) -> None:
    from kit import cli

    res = cli("launch", "no-such-cluster", "--env", "TOKEN=a\nb", "--", EXAMPLE, home=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "the value of TOKEN contains a newline" in res.stderr
    assert "no-such-cluster" not in res.stderr
