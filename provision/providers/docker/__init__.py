"""Docker provider (local node emulation). The docker SDK is imported only when used."""

from provision.providers.docker.provider import DockerProvider

PROVIDER_CLASS = DockerProvider

__all__ = ["PROVIDER_CLASS", "DockerProvider"]
