"""What a node's serial console shows, for the console-output fake (aws_fakes.AwsFakes)."""

from __future__ import annotations


def console_output(public_key: str, *, with_keys: bool = True) -> str:
    """A Nitro instance's serial console as GetConsoleOutput returns it (decoded): kernel and
    cloud-init lines, then what cloud-init's keys_to_console prints at the end of first boot
    (tools/write-ssh-key-fingerprints piped through `logger --stderr -t ec2`, so every line
    carries a syslog prefix); lines end in CRLF as on a serial console."""
    from provision.cluster.providers.aws.hostkeys import fingerprint

    b64 = public_key.split()[1]
    boot = [
        "[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-062) #23~22.04.1-Ubuntu",
        "[    4.210000] cloud-init[1034]: Cloud-init v. 24.4-0ubuntu1~22.04.1 running 'init' "
        "at Tue, 11 Aug 2026 09:12:03 +0000. Up 12.41 seconds.",
        "ci-info: +++++++++++++++++++++++++Net device info+++++++++++++++++++++++++",
        "[   31.870000] cloud-init[1688]: Generating public/private ed25519 key pair.",
    ]
    prefix = "<14>Aug 11 09:12:41 ec2: "
    keys = [prefix + line for line in (
        "#############################################################",
        "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
        f"256 {fingerprint(b64)} root@ip-172-31-10-20 (ED25519)",
        "-----END SSH HOST KEY FINGERPRINTS-----",
        "#############################################################",
        "-----BEGIN SSH HOST KEY KEYS-----",
        f"{public_key} root@ip-172-31-10-20",
        "-----END SSH HOST KEY KEYS-----",
    )]
    tail = ["Cloud-init v. 24.4-0ubuntu1~22.04.1 finished at Tue, 11 Aug 2026 09:12:42 +0000. "
            "Datasource DataSourceEc2Local.  Up 47.02 seconds"]
    return "\r\n".join(boot + (keys + tail if with_keys else [])) + "\r\n"
