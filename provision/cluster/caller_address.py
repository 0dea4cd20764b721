"""The caller's public address, for the default SSH rule (`--ssh-cidr` unset)."""

from __future__ import annotations

import ipaddress
import os
import urllib.request

from provision.model.errors import UserInputError

CHECKIP_URLS = ("https://checkip.amazonaws.com", "https://api.ipify.org")


def caller_cidr(timeout: float = 3.0) -> str:
    """'A.B.C.D/32' of this machine as the internet sees it.

    `MGPU_CLOUD_CALLER_IP` overrides the lookup (tests, or a controller behind a known NAT).
    Raises UserInputError asking for --ssh-cidr when the address cannot be found: SSH is never
    opened to the world by default.
    """
    override = os.environ.get("MGPU_CLOUD_CALLER_IP")
    candidates = [override] if override else []
    if not override:
        for url in CHECKIP_URLS:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
                    candidates.append(resp.read(64).decode().strip())
                    break
            except OSError:
                continue
    for text in candidates:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            continue
        return f"{addr}/{addr.max_prefixlen}"
    raise UserInputError(
        "could not find this machine's public address to open SSH to it alone",
        hint="pass --ssh-cidr with your address range, e.g. --ssh-cidr 203.0.113.7/32",
    )
