"""tests/botocache.py keeps what botocore and moto rebuild on every call; these check it keeps
only what is the same, and steps aside where somebody else shapes a client class."""

from __future__ import annotations

from typing import Any

import boto3
import botocache
import pytest


@pytest.fixture(autouse=True)
def _installed() -> None:
    botocache.install()


def test_one_class_per_service_across_sessions_with_the_same_methods() -> None:
    a, b = (boto3.session.Session(region_name="us-east-1") for _ in range(2))
    assert type(a.client("ec2")) is type(b.client("ec2"))
    s3 = a.client("s3")
    assert type(s3) is type(b.client("s3"))
    assert type(s3) is not type(a.client("ec2"))
    assert hasattr(s3, "upload_file")  # boto3's handler still shaped the cached class
    assert hasattr(s3, "generate_presigned_post")  # and botocore's


def test_sessions_with_other_handlers_get_other_classes() -> None:
    """A plain botocore session has botocore's handlers but not boto3's S3 transfer methods."""
    import botocore.session

    assert hasattr(boto3.session.Session(region_name="us-east-1").client("s3"), "upload_file")
    plain = botocore.session.get_session().create_client("s3", region_name="us-east-1")
    assert not hasattr(plain, "upload_file")
    assert hasattr(plain, "generate_presigned_post")


def test_a_handler_from_elsewhere_gets_a_class_of_its_own() -> None:
    """Two handlers of one name (closures over different words): only the step-aside rule
    keeps the second session from getting the first one's class."""
    def shaping(word: str) -> Any:
        def add_method(class_attributes: dict[str, Any], **_: Any) -> None:
            class_attributes["only_here"] = lambda self: word
        return add_method

    plain = boto3.session.Session(region_name="us-east-1").client("sts")
    shaped = []
    for word in ("a", "b"):
        session = boto3.session.Session(region_name="us-east-1")
        session.events.register("creating-client-class.sts", shaping(word))
        shaped.append(session.client("sts"))
    assert [c.only_here() for c in shaped] == ["a", "b"]
    assert not hasattr(plain, "only_here")
    assert not hasattr(boto3.session.Session(region_name="us-east-1").client("sts"),
                       "only_here")


def test_installing_twice_wraps_once() -> None:
    import botocore.client
    import moto.core.responses

    before = (botocore.client.ClientCreator._create_client_class,
              moto.core.responses.method_names_from_class)
    botocache.install()
    assert (botocore.client.ClientCreator._create_client_class,
            moto.core.responses.method_names_from_class) == before
