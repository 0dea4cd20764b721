"""The read-only part of the Compute fake: regions, machine types, accelerator types and image
families (with their deprecation state). A mixin of FakeCompute (fake_compute.py)."""

from __future__ import annotations

from typing import Any

BASE = "https://www.googleapis.com/compute/v1"


def _gpus(kind: str, count: int) -> list[dict[str, Any]]:
    return [{"guestAcceleratorType": kind, "guestAcceleratorCount": count}]


A100_40, A100_80, H100 = "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb"
DEFAULT_MACHINE_TYPES: dict[str, dict[str, Any]] = {
    "a2-highgpu-1g": {"guestCpus": 12, "accelerators": _gpus(A100_40, 1)},
    "a2-highgpu-2g": {"guestCpus": 24, "accelerators": _gpus(A100_40, 2)},
    "a2-highgpu-4g": {"guestCpus": 48, "accelerators": _gpus(A100_40, 4)},
    "a2-highgpu-8g": {"guestCpus": 96, "accelerators": _gpus(A100_40, 8)},
    "a2-megagpu-16g": {"guestCpus": 96, "accelerators": _gpus(A100_40, 16)},
    "a2-ultragpu-1g": {"guestCpus": 12, "accelerators": _gpus(A100_80, 1)},
    "a2-ultragpu-2g": {"guestCpus": 24, "accelerators": _gpus(A100_80, 2)},
    "a2-ultragpu-4g": {"guestCpus": 48, "accelerators": _gpus(A100_80, 4)},
    "a2-ultragpu-8g": {"guestCpus": 96, "accelerators": _gpus(A100_80, 8)},
    "a3-highgpu-8g": {"guestCpus": 208, "accelerators": _gpus(H100, 8)},
    "a3-megagpu-8g": {"guestCpus": 208, "accelerators": _gpus("nvidia-h100-mega-80gb", 8)},
    "a3-ultragpu-8g": {"guestCpus": 224, "accelerators": _gpus("nvidia-h200-141gb", 8)},
    # A4: 8 x B200 (Blackwell), not in the shipped catalog: its GPUs come from Compute
    "a4-highgpu-8g": {"guestCpus": 224, "accelerators": _gpus("nvidia-b200", 8)},
    "g2-standard-4": {"guestCpus": 4, "accelerators": _gpus("nvidia-l4", 1)},
    "g2-standard-8": {"guestCpus": 8, "accelerators": _gpus("nvidia-l4", 1)},
    "n1-standard-4": {"guestCpus": 4},
    "e2-small": {"guestCpus": 2},  # the managed runs' controller
    "n1-standard-8": {"guestCpus": 8},
    "n1-standard-16": {"guestCpus": 16},
}
DEFAULT_ZONES = {
    "us-central1-a": list(DEFAULT_MACHINE_TYPES),
    "us-central1-b": ["a2-highgpu-8g", "n1-standard-8"],
    "us-central1-c": ["a2-ultragpu-8g", "a2-highgpu-8g", "a3-highgpu-8g", "n1-standard-8"],
    "us-central1-f": ["a2-ultragpu-8g", "n1-standard-8"],
    "europe-west4-a": ["a2-ultragpu-8g", "n1-standard-8"],
}
DEFAULT_ACCELERATORS = {z: ["nvidia-tesla-t4"] for z in ("us-central1-a", "us-central1-b")}
# project -> family -> state of its newest image ("READY", or a deprecation state).
# common-cu121-debian-11-py310, the old default, is gone (retired with Debian 11).
DEFAULT_IMAGES: dict[str, dict[str, str]] = {
    "deeplearning-platform-release": {
        "common-cu129-ubuntu-2404-nvidia-580": "READY",
        "pytorch-2-9-cu129-ubuntu-2404-nvidia-580": "READY",
        "common-cu129-ubuntu-2204-nvidia-580": "READY",
        "pytorch-2-9-cu129-ubuntu-2204-nvidia-580": "READY",
        "common-cu128-ubuntu-2204-nvidia-570": "DEPRECATED",
        "pytorch-latest-gpu": "READY",
    },
}


class HttpError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class CatalogMixin:
    CATALOG_ROUTES: list[tuple[str, str, str]] = [
        ("GET", r"projects/([^/]+)/aggregated/machineTypes$", "_aggregated_machine_types"),
        ("GET", r"projects/([^/]+)/aggregated/acceleratorTypes$", "_aggregated_accelerators"),
    ]
    zones: dict[str, list[str]]
    machine_types: dict[str, dict[str, Any]]
    accelerators: dict[str, list[str]]
    images: dict[str, dict[str, str]]

    def _init_catalog(self, zones: dict[str, list[str]] | None) -> None:
        self.zones = zones or {z: list(v) for z, v in DEFAULT_ZONES.items()}
        self.machine_types = dict(DEFAULT_MACHINE_TYPES)
        self.accelerators = {z: list(v) for z, v in DEFAULT_ACCELERATORS.items()}
        self.images = {p: dict(f) for p, f in DEFAULT_IMAGES.items()}

    def _region_of(self, zone: str) -> str:
        return zone.rsplit("-", 1)[0]

    def gpu_count(self, machine_type: str) -> int:
        return sum(int(a["guestAcceleratorCount"])
                   for a in self.machine_types.get(machine_type, {}).get("accelerators", []))

    def _get_region(self, project: str, region: str, **_: Any) -> tuple[int, Any]:
        zones = [z for z in self.zones if self._region_of(z) == region]
        if not zones:
            raise HttpError(404, "notFound", f"region {region} not found")
        return 200, {"name": region, "status": "UP",
                     "zones": [f"{BASE}/projects/{project}/zones/{z}" for z in zones]}

    def _get_machine_type(self, project: str, zone: str, name: str, **_: Any) -> tuple[int, Any]:
        if zone not in self.zones:
            raise HttpError(404, "notFound", f"zone {zone} not found")
        if name not in self.zones[zone] or name not in self.machine_types:
            raise HttpError(404, "notFound", f"machine type {name} not found in {zone}")
        return 200, {"name": name, "zone": zone, **self.machine_types[name],
                     "selfLink": f"{BASE}/projects/{project}/zones/{zone}/machineTypes/{name}"}

    def _get_accelerator(self, project: str, zone: str, name: str, **_: Any) -> tuple[int, Any]:
        if name not in self.accelerators.get(zone, []):
            raise HttpError(404, "notFound", f"accelerator type {name} not found in {zone}")
        return 200, {"name": name, "zone": zone, "maximumCardsPerInstance": 4}

    def _get_image_family(self, project: str, family: str, **_: Any) -> tuple[int, Any]:
        state = self.images.get(project, {}).get(family)
        if state is None:
            raise HttpError(404, "notFound", f"image family {family} not found")
        name = f"{family}-v20260804"
        image: dict[str, Any] = {
            "name": name, "family": family, "status": "READY",
            "selfLink": f"{BASE}/projects/{project}/global/images/{name}"}
        if state != "READY":
            image["deprecated"] = {"state": state}
        return 200, image

    def _aggregated_machine_types(self, project: str, query: dict[str, str],
                                  **_: Any) -> tuple[int, Any]:
        from fake_compute_project import name_filter

        wanted = name_filter(query.get("filter"))
        items = {}
        for zone, types in self.zones.items():
            found = [self._get_machine_type(project, zone, t)[1] for t in types
                     if t in self.machine_types and wanted in (None, t)]
            if found:
                items[f"zones/{zone}"] = {"machineTypes": found}
        return 200, {"items": items}

    def _aggregated_accelerators(self, project: str, query: dict[str, str],
                                 **_: Any) -> tuple[int, Any]:
        from fake_compute_project import name_filter

        wanted = name_filter(query.get("filter"))
        items = {}
        for zone, types in self.accelerators.items():
            found = [self._get_accelerator(project, zone, t)[1] for t in types
                     if wanted in (None, t)]
            if found:
                items[f"zones/{zone}"] = {"acceleratorTypes": found}
        return 200, {"items": items}
