"""Docker provider (local node emulation): nodes are containers on one shared bridge network.

Cheap to import (the CLI reads INFO at start-up); the docker SDK is imported only when used.
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="docker",
    summary="containers on this machine (free; rehearse a multi-node job)",
    options="provision.cluster.providers.docker.options:DockerOptions",
    implementation="provision.cluster.providers.docker.provider:DockerProvider",
    costs_money=False,
    commands=(("image", "provision.cluster.providers.docker.cli:image_app"),),
    # sshd is the container's PID 1: TERM stops the container (it cannot remove itself).
    self_stop="kill -TERM 1",
    self_stop_note="each node container stops itself; `down` removes the stopped containers "
                   "and the inventory",
    monitor_note="CPU, memory and load are this machine's (docker nodes share its kernel)",
    flags=(
        Flag("--base-image", "base_image", help="base of the node image"),
        Flag("--node-image", "image", help="use this node image as is"),
        Flag("--simulate-boot", "simulate_boot", type=float,
             help="SECONDS each node (new, replacement or spare) takes to boot before SSH "
                  "answers, as a cloud VM (0)"),
    ),
)
