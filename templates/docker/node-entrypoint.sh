#!/bin/sh
# The tool hands a node its host key and the cluster's public key in the container's
# environment (docker's counterpart of cloud user-data: no extra API call before start).
# They are written before sshd starts and are not in the environment sshd runs with.
# A node without a host key is a bug, not something to paper over with a generated one.
set -e
umask 077
if [ -n "${MGPU_HOST_KEY:-}" ]; then
  printf '%s\n' "$MGPU_HOST_KEY" > /etc/ssh/ssh_host_ed25519_key
fi
if [ -n "${MGPU_AUTHORIZED_KEY:-}" ]; then
  printf '%s\n' "$MGPU_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
fi
unset MGPU_HOST_KEY MGPU_AUTHORIZED_KEY
if [ ! -s /etc/ssh/ssh_host_ed25519_key ]; then
  echo "node-entrypoint: no host key (MGPU_HOST_KEY unset, /etc/ssh/ssh_host_ed25519_key missing)" >&2
  exit 1
fi
chmod 600 /etc/ssh/ssh_host_ed25519_key
exec /usr/sbin/sshd -D -e
