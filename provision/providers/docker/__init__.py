"""Docker provider (local node emulation): nodes are containers on a private bridge network.

Cheap to import (the CLI reads INFO at start-up); the docker SDK is imported only when used.
"""

from provision.providers import Flag, ProviderInfo

INFO = ProviderInfo(
    name="docker",
    summary="containers on this machine (free; rehearse a multi-node job)",
    options="provision.providers.docker.options:DockerOptions",
    implementation="provision.providers.docker.provider:DockerProvider",
    costs_money=False,
    commands=(("image", "provision.providers.docker.cli:image_app"),),
    flags=(
        Flag("--base-image", "base_image", help="base of the node image"),
        Flag("--node-image", "image", help="use this node image as is"),
    ),
)
