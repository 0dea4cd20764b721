"""The AWS provider's fixtures: moto's mock_aws with the fakes of aws_fakes.py (what moto lacks:
a request recorder, placement groups, the DLAMI's SSM parameter, fault injectors, console
output, the Elastic IP quota, scripted images) on every client the provider makes.

Everything is attached through the provider's documented seam `clients.add_client_hook`, and
retry waits are zeroed through `retry.using(retry.NO_WAIT)`.

Every test also runs through aws_rules.py (the autouse `aws_rules` fixture): EC2's documented
rules moto does not enforce, on every request and on the state `create` leaves; a violation
fails the test. Under moto the default VPC first gets what a real one has (internet gateway,
0.0.0.0/0 route), so "every node has a path to the internet" means something.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import aws_rules  # noqa: E402
from aws_fakes import (  # noqa: E402
    REGION,
    SETUP,
    AwsFakes,
    make_spec,
    moto_client,
    register_dlami,
    tagged_resources,
    up,
)

CALLER_IP = "203.0.113.7"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Fake credentials and region, a private state dir, a known caller address."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("MGPU_CLOUD_CALLER_IP", CALLER_IP)
    # moto's default AMI catalogue takes seconds per test to load; tests register one image.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    home = tmp_path / "mgpu-home"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(home))
    return home


@pytest.fixture
def aws_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS credentials of any kind (a dry run without an account), a known caller address
    and a private state dir."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("MGPU_CLOUD_CALLER_IP", "203.0.113.7")
    home = tmp_path / "home"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(home))
    return home


class RulesLayer:
    """The autouse rules fixture's state: request rules on every provider client; under moto,
    a real-looking default VPC per region and the state rules after every `create`."""

    def __init__(self) -> None:
        self.rules = aws_rules.AwsRules()
        self.moto = False
        self.prepared: set[str] = set()
        self.creates_checked = 0

    def hook(self, client: Any) -> None:
        self.rules.attach(client)
        if self.moto and client.meta.service_model.service_name == "ec2":
            self.prepare(client.meta.region_name)

    def prepare(self, region: str) -> None:
        with SETUP:
            if region not in self.prepared:
                aws_rules.real_default_vpc(moto_client(region))
                self.prepared.add(region)

    def after_create(self) -> None:
        self.creates_checked += 1
        self.rules.check_state(moto_client)


@pytest.fixture(autouse=True)
def aws_rules_layer(monkeypatch: pytest.MonkeyPatch) -> Iterator[RulesLayer]:
    """Every AWS test: EC2's rules on each request and on the state `create` (and `replace`,
    and the managed runs' `create_controller`) leaves."""
    from provision.cluster.providers.aws import clients
    from provision.cluster.providers.aws.provider import AwsProvider

    layer = RulesLayer()
    remove = clients.add_client_hook(layer.hook)
    create = AwsProvider.create

    def checked_create(self: Any, *args: Any, **kwargs: Any) -> None:
        create(self, *args, **kwargs)
        layer.after_create()

    monkeypatch.setattr(AwsProvider, "create", checked_create)
    replace = AwsProvider.replace

    def checked_replace(self: Any, *args: Any, **kwargs: Any) -> Any:
        new = replace(self, *args, **kwargs)
        layer.after_create()  # a replacement obeys the same rules as the nodes of `up`
        return new

    monkeypatch.setattr(AwsProvider, "replace", checked_replace)
    make_controller = AwsProvider.create_controller

    def checked_controller(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = make_controller(self, *args, **kwargs)
        layer.after_create()  # the controller too: its path to the internet
        return made

    monkeypatch.setattr(AwsProvider, "create_controller", checked_controller)
    try:
        yield layer
    finally:
        remove()
    if layer.rules.violations:
        pytest.fail("EC2 rules violated:\n  " + "\n  ".join(layer.rules.violations))


@pytest.fixture
def fakes(aws_env: Path, aws_rules_layer: RulesLayer) -> Iterator[AwsFakes]:
    """moto's mock_aws + the fakes above on every client the provider makes; no retry waits."""
    import botocache
    from moto import mock_aws

    from provision.cluster.providers.aws import clients, retry

    botocache.install()
    with mock_aws(), retry.using(retry.NO_WAIT):
        aws_rules_layer.moto = True
        aws_rules_layer.prepare(REGION)
        f = AwsFakes()
        f.dlami = register_dlami(moto_client())
        remove = clients.add_client_hook(f.attach)
        try:
            yield f
        finally:
            remove()
            aws_rules_layer.moto = False

@pytest.fixture
def tagged(fakes: AwsFakes) -> Callable[..., dict[str, list[str]]]:
    return lambda cluster=None: tagged_resources(fakes, cluster)


@pytest.fixture
def spec_for() -> Callable[..., Any]:
    return make_spec


@pytest.fixture
def store(aws_env: Path) -> Any:
    from provision.model.inventory import InventoryStore

    return InventoryStore(aws_env)


@pytest.fixture
def up_cluster(store: Any) -> Callable[[Any], Any]:
    return lambda spec: up(spec, store)


@pytest.fixture
def moto_ec2(fakes: AwsFakes) -> Any:
    return moto_client()


@pytest.fixture
def moto_in(fakes: AwsFakes) -> Callable[[str], Any]:
    """moto's EC2 state in a given region (a plain client)."""
    return moto_client
