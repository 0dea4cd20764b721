#!/bin/sh
# The docker provider copies a container's host key (/etc/ssh/ssh_host_ed25519_key) and the
# public key it authorizes (/root/.ssh/authorized_keys) into it, 0600, between create and
# start (provision/cluster/providers/docker/environment.py): nothing secret in the container's
# environment, where `docker inspect` shows it. Test harnesses that start the image by hand
# (`docker run -e`) may still pass MGPU_HOST_KEY / MGPU_AUTHORIZED_KEY: written before sshd
# starts, and not in the environment sshd runs with.
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
  echo "node-entrypoint: no host key (/etc/ssh/ssh_host_ed25519_key missing or empty)" >&2
  exit 1
fi
chmod 600 /etc/ssh/ssh_host_ed25519_key
exec /usr/sbin/sshd -D -e
