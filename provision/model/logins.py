"""The syntax of a login's parts (user, host, jump host) wherever the tool takes them in:
each reaches ssh, pdsh or a hostfile as a command-line word, so nothing may start with "-"
(ssh and pdsh would read it as an option: `-oProxyCommand=...`), and nothing holds spaces,
quotes, "@" or shell characters. NodeRecord checks its fields with it (an inventory,
written here or adopted from a store, is refused before any of it is used)."""

from __future__ import annotations

import re

USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
HOST_RE = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]{0,252}")  # a name, IPv4, IPv6 (%zone)
USER_RULE = "a login name: letters, digits, '_', '.', '-', not starting with '-'"
HOST_RULE = "a host name or IP address: letters, digits, '_', '.', ':', '-', not starting with '-'"


def checked_login_field(field: str, value: str) -> str:
    """`value` when it is a valid `field` ("user", "proxy_jump" as user@host:port, or a host:
    "address", "private_address", "name"); ValueError naming the rule otherwise."""
    if field == "user":
        return _checked(value, USER_RE, USER_RULE, "user")
    if field != "proxy_jump":
        return _checked(value, HOST_RE, HOST_RULE, field)
    user, at, hostport = value.rpartition("@")
    host, _, port = hostport.partition(":")
    if at:
        _checked(user, USER_RE, USER_RULE, "proxy_jump's user")
    _checked(host, HOST_RE, HOST_RULE, "proxy_jump's host")
    if port and not port.isdigit():
        raise ValueError(f"proxy_jump {value!r} is not user@host:port (port: digits)")
    return value


def _checked(value: str, rule: re.Pattern[str], says: str, field: str) -> str:
    if not rule.fullmatch(value):
        raise ValueError(f"{field} {value!r} is not {says} (ssh would read a leading '-' as "
                         "an option); correct it where it came from (the hosts file, the "
                         "ssh config, the inventory)")
    return value
