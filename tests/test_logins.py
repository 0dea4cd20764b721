"""Issue 42: the login syntax (model/logins.py) refuses a value for the one reason that makes
it dangerous, a leading '-' (ssh and pdsh read it as an option), with nothing else wrong in it;
and takes every ordinary name, so a rule that refuses too much fails here too."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from provision.model.inventory import NodeRecord
from provision.model.logins import checked_login_field

DASHED = {"user": "-x", "address": "-h", "private_address": "-h", "name": "-n",
          "proxy_jump": "-x"}
GOOD = {
    "user": ["root", "ubuntu", "ec2-user", "a.b_c", "_svc", "x" * 64, "9lives", "a-"],
    "address": ["203.0.113.7", "node-1", "fe80::1%eth0", "host.example.com", "_h", "::1"],
    "proxy_jump": ["bastion", "ops@bastion", "ops@bastion:2222", "ops@203.0.113.9:22",
                   "a-b@c-d"],
}
BAD = {
    "user": ["-x", "-", "-oProxyCommand=x", "x" * 65, "a b", "a/b", "a=b", "a@b", "", "a\n"],
    "address": ["-h", "-", "a b", "a/b", "a@b", "", "h;x", "h\n"],
    "proxy_jump": ["-x", "u@-h", "-u@h", "u@h:-22", "u@h:2x", "u@", "@h", "u@h p", ""],
}


@pytest.mark.parametrize(("field", "value"), list(DASHED.items()))
def test_a_leading_dash_alone_is_refused(field: str, value: str) -> None:
    assert value[1:].isalnum()  # nothing else in it is wrong
    with pytest.raises(ValueError, match="not starting with '-'|is not a") as err:
        checked_login_field(field, value)
    assert "ssh would read a leading '-' as an option" in str(err.value)


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, vs in GOOD.items() for v in vs])
def test_ordinary_names_pass(field: str, value: str) -> None:
    assert checked_login_field(field, value) == value


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, vs in BAD.items() for v in vs])
def test_what_ssh_could_misread_is_refused(field: str, value: str) -> None:
    with pytest.raises(ValueError):
        checked_login_field(field, value)


@pytest.mark.parametrize("field", ["user", "address", "private_address", "name", "proxy_jump"])
def test_a_node_record_with_a_dashed_field_does_not_load(field: str) -> None:
    fields = {"name": "node-0", "rank": 0, "address": "203.0.113.7", "port": 22,
              "private_address": "10.0.0.2", "user": "root", field: DASHED[field]}
    with pytest.raises(ValidationError, match=field):
        NodeRecord(**fields)
    fields[field] = GOOD["proxy_jump"][1] if field == "proxy_jump" else "ok-name"
    assert getattr(NodeRecord(**fields), field) == fields[field]


@pytest.mark.parametrize(("field", "value", "said"), [
    ("user", "-x", "user '-x' is not a login name: letters, digits, '_', '.', '-', not "
                   "starting with '-'"),
    ("address", "-h", "address '-h' is not a host name or IP address: letters, digits, '_', "
                      "'.', ':', '-', not starting with '-'"),
    ("name", "-n", "name '-n' is not a host name or IP address"),
    ("proxy_jump", "-u@h", "proxy_jump's user '-u' is not a login name"),
    ("proxy_jump", "u@-h", "proxy_jump's host '-h' is not a host name or IP address"),
    ("proxy_jump", "u@h:x", "proxy_jump 'u@h:x' is not user@host:port (port: digits)"),
])
def test_the_refusal_names_the_field_the_value_the_rule_and_where_to_fix_it(
        field: str, value: str, said: str) -> None:
    with pytest.raises(ValueError) as err:
        checked_login_field(field, value)
    text = str(err.value)
    assert text.startswith(said), text
    if "port" not in said:
        assert text.endswith("(ssh would read a leading '-' as an option); correct it where "
                             "it came from (the hosts file, the ssh config, the inventory)")
