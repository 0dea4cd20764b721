"""The boot image: resolved at plan time from a current Deep Learning VM family, with an ordered
fallback list, so a family Google retires does not stop every `up` with a 404.

Deep Learning VM families live in project deeplearning-platform-release ("Choose an image",
https://cloud.google.com/deep-learning-vm/docs/images: family names are
FRAMEWORK-CUDA-OS-DRIVER, e.g. common-cu129-ubuntu-2404-nvidia-580). In 2026 the current ones
are the CUDA 12.9 / driver 580 families on Ubuntu 24.04 and 22.04 (images such as
common-cu129-ubuntu-2404-nvidia-580-v20260626 are in use in public scripts); the CUDA 12.8 /
driver 570 ones are deprecated (no images after v20260320) and the Debian 11 ones
(common-cu121-debian-11-py310, the old default) are reported retired. Sources: the page above
and cloud-facts 4.1 (public scripts and templates, 2025-26; not every family confirmed against
Google's release notes, hence the list). Ubuntu 24.04 comes first: its Python 3.12 and kernel
are what current accelerator images ship (its NIC names differ from 22.04's: the GPUDirect
set-up finds NICs by PCI address, gpudirect.py). `common-*` images carry CUDA and the NVIDIA
driver, which is all container mode needs.

images.getFromFamily returns the newest image of a family that is not deprecated; an image
marked DEPRECATED still works (used only when nothing newer does), OBSOLETE and DELETED images
cannot create VMs ("Image deprecation states", Compute Engine docs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provision.cluster.providers.gcp.clients import Clients
from provision.model.errors import ProviderUnavailableError, UserInputError
from provision.model.spec import ClusterSpec

DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"
DEFAULT_IMAGE_FAMILIES = (
    "common-cu129-ubuntu-2404-nvidia-580",
    "pytorch-2-9-cu129-ubuntu-2404-nvidia-580",
    "common-cu129-ubuntu-2204-nvidia-580",
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580",
    "common-cu128-ubuntu-2204-nvidia-570",
    "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
    "common-cu124-debian-11-py310",
    "common-cu124-debian-11",
    "common-cu121-debian-11-py310",
)
UNUSABLE = frozenset({"OBSOLETE", "DELETED"})


@dataclass
class ResolvedImage:
    self_link: str
    name: str
    family: str
    project: str
    tried: list[str] = field(default_factory=list)  # "family: why it was skipped"


def _state(image: Any) -> str:
    deprecated = getattr(image, "deprecated", None)
    return str(getattr(deprecated, "state", "") or "") if deprecated else ""


def resolve_image(clients: Clients, family: str | None, project: str | None) -> ResolvedImage:
    """The image to boot: `family` alone when given (the user chose it), else the first usable
    family of DEFAULT_IMAGE_FAMILIES. Read-only. UserInputError listing every family tried
    when none is usable."""
    from google.cloud import compute_v1

    image_project = project or DEFAULT_IMAGE_PROJECT
    families = (family,) if family else DEFAULT_IMAGE_FAMILIES
    tried: list[str] = []
    deprecated: ResolvedImage | None = None
    for fam in families:
        image = clients.call_or_none(
            clients.images.get_from_family,
            compute_v1.GetFromFamilyImageRequest(project=image_project, family=fam),
            f"looking up image family {fam}", ProviderUnavailableError)
        if image is None:
            tried.append(f"{fam}: not found")
            continue
        state = _state(image)
        found = ResolvedImage(self_link=image.self_link, name=image.name, family=fam,
                              project=image_project, tried=list(tried))
        if state in UNUSABLE:
            tried.append(f"{fam}: {image.name} is {state}")
        elif state == "DEPRECATED":
            tried.append(f"{fam}: {image.name} is DEPRECATED")
            deprecated = deprecated or found
        else:
            return found
    if deprecated is not None:
        deprecated.tried = tried
        return deprecated
    hint = ("list the current Deep Learning VM families with `gcloud compute images list "
            f"--project {DEFAULT_IMAGE_PROJECT} --no-standard-images --format='value(family)'"
            " | sort -u`, then pass --image-family")
    if family:
        hint += " (leave --image-family out to use mgpu-cloud's list: " + \
            ", ".join(DEFAULT_IMAGE_FAMILIES) + ")"
    raise UserInputError(
        f"no usable boot image in project {image_project!r}; tried: " + "; ".join(tried),
        hint=hint,
    )


def training_image_of(spec: ClusterSpec, gpu_model: str | None,
                      machine_type: str) -> dict[str, Any]:
    """The Layout's GPU model and training container: --image (refused at plan time when it
    is a known NGC release too old for the GPUs), else the default of their architecture
    (provision/nodes/container.py, the same rule as AWS)."""
    from provision.nodes.container import training_image

    return {"gpu_model": gpu_model,
            "training_image": training_image(spec.image, gpu_model, machine_type)}
