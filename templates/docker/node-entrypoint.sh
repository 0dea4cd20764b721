#!/bin/sh
# The tool copies the node's host key and authorized_keys in before the container starts;
# a node without a host key is a bug, not something to paper over with a generated one.
set -e
if [ ! -s /etc/ssh/ssh_host_ed25519_key ]; then
  echo "node-entrypoint: /etc/ssh/ssh_host_ed25519_key is missing" >&2
  exit 1
fi
chmod 600 /etc/ssh/ssh_host_ed25519_key
exec /usr/sbin/sshd -D -e
