"""What a node is told at boot (cloud-init user data, templates/aws/user-data.yaml.j2)."""

from __future__ import annotations


def user_data(cluster: str, max_seconds: int, image: str | None = None) -> str:
    """The cloud-init user data of a node: fresh host keys of its own, printed on its console
    (hostkeys.py), a power-off (= terminate) `max_seconds` after boot, and the pull of the
    training `image` started at boot (bootstrap finds it done or under way). No secret."""
    from provision.model.render import render
    from provision.nodes.bootstrap import boot_pull

    max_seconds = max(60, max_seconds)
    return render(
        "aws/user-data.yaml.j2", cluster=cluster,
        max_hours=f"{max_seconds / 3600:g}", max_seconds=max_seconds,
        max_minutes=max(1, max_seconds // 60), **boot_pull(image),
    )
