"""Which Deep Learning AMI a type is launched on (issue 38), under moto and the rules layer
(aws_rules.image_supports: the Ubuntu 22.04 DLAMI's release notes do not list p6-b300 among
the instances it supports): p6-b300 gets the Ubuntu 24.04 DLAMI's SSM parameter, other types
keep 22.04."""

from __future__ import annotations


def test_p6_b300_is_launched_on_the_ubuntu_24_04_dlami(fakes, spec_for, up_cluster,
                                                     moto_ec2) -> None:
    """Before: every type got the 22.04 DLAMI; the rules layer now fails that launch."""
    inv = up_cluster(spec_for(instance_type="p6-b300.48xlarge", nodes=1))
    (asked,) = [p["Name"] for p in fakes.calls("GetParameter")
                if p["Name"].startswith("/aws/service/deeplearning/")]
    assert "base-oss-nvidia-driver-gpu-ubuntu-24.04" in asked
    (run,) = fakes.calls("RunInstances")
    (image,) = moto_ec2.describe_images(ImageIds=[run["ImageId"]])["Images"]
    assert "(Ubuntu 24.04)" in image["Name"] and inv.nodes


def test_other_types_keep_the_ubuntu_22_04_dlami(fakes, spec_for, up_cluster) -> None:
    up_cluster(spec_for(instance_type="g6.xlarge", nodes=1))
    (asked,) = [p["Name"] for p in fakes.calls("GetParameter")
                if p["Name"].startswith("/aws/service/deeplearning/")]
    assert "base-oss-nvidia-driver-gpu-ubuntu-22.04" in asked
    assert fakes.calls("RunInstances")[0]["ImageId"] == fakes.dlami
