#!/bin/sh
# Entrypoint of the emulated Slurm node (every role). Everything per-cluster arrives in env vars
# (like the node image's MGPU_HOST_KEY / MGPU_AUTHORIZED_KEY), so no host files are bind-mounted:
#   SLURM_ROLE        controller | compute
#   SLURM_CONF_B64    base64 of /etc/slurm/slurm.conf (same on every node)
#   GRES_CONF_B64     optional base64 of /etc/slurm/gres.conf
#   FAKE_GPUS         optional N: make /dev/nvidia0..N-1 (char devices 195:i, never opened) so that
#                     gres.conf can say File=/dev/nvidia[0-N-1]; a gpu Count without File, or
#                     regular files, make slurmd report 0 GPUs and the node INVAL/DRAIN.
#   MUNGE_KEY_B64     base64 of the cluster's munge key (same on every node)
#   SLURM_ACCOUNTING  optional 1 (controller, slurm-acct image): start MariaDB + slurmdbd first
#   CLUSTER_SSH_KEY   optional private key for ssh between nodes (root and 'user' get it)
#   KNOWN_HOSTS       optional /etc/ssh/ssh_known_hosts (host keys of all nodes)
#   HOST_PUBKEY       optional public half of MGPU_HOST_KEY -> /etc/ssh/ssh_host_ed25519_key.pub
#                     (node-entrypoint.sh writes only the private key; real nodes have both)
#   MGPU_HOST_KEY, MGPU_AUTHORIZED_KEY  consumed by node-entrypoint.sh (sshd), which we exec last.
set -e
umask 022
: "${SLURM_ROLE:?SLURM_ROLE unset}"
: "${SLURM_CONF_B64:?SLURM_CONF_B64 unset}"
: "${MUNGE_KEY_B64:?MUNGE_KEY_B64 unset}"

printf '%s' "$SLURM_CONF_B64" | base64 -d > /etc/slurm/slurm.conf
if [ -n "${GRES_CONF_B64:-}" ]; then printf '%s' "$GRES_CONF_B64" | base64 -d > /etc/slurm/gres.conf; fi
i=0
while [ "$i" -lt "${FAKE_GPUS:-0}" ]; do   # needs CAP_MKNOD (in docker's default set)
  [ -e "/dev/nvidia$i" ] || mknod "/dev/nvidia$i" c 195 "$i"
  i=$((i + 1))
done

# munge: key owned by munge, 0400; munged refuses group/world-accessible keys and dirs.
(umask 077; printf '%s' "$MUNGE_KEY_B64" | base64 -d > /etc/munge/munge.key)
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge

# The normal user: home may be a fresh shared volume (then it starts empty).
mkdir -p /home/user/.ssh
if [ -n "${MGPU_AUTHORIZED_KEY:-}" ]; then
  printf '%s\n' "$MGPU_AUTHORIZED_KEY" > /home/user/.ssh/authorized_keys
fi
if [ -n "${CLUSTER_SSH_KEY:-}" ]; then
  for d in /root/.ssh /home/user/.ssh; do
    (umask 077; printf '%s\n' "$CLUSTER_SSH_KEY" > "$d/id_ed25519")
  done
fi
if [ -n "${KNOWN_HOSTS:-}" ]; then printf '%s\n' "$KNOWN_HOSTS" > /etc/ssh/ssh_known_hosts; fi
if [ -n "${HOST_PUBKEY:-}" ]; then printf '%s\n' "$HOST_PUBKEY" > /etc/ssh/ssh_host_ed25519_key.pub; fi
chown -R user:user /home/user/.ssh 2>/dev/null || true  # a shared home: every node does the same
chmod 700 /home/user/.ssh

unset SLURM_CONF_B64 GRES_CONF_B64 FAKE_GPUS MUNGE_KEY_B64 CLUSTER_SSH_KEY KNOWN_HOSTS HOST_PUBKEY

runuser -u munge -- /usr/sbin/munged
# Jobs inherit slurmd's limits (PropagateResourceLimits=NONE): no core dumps (a torch worker's
# core is ~280 MB and lands in the job's cwd, i.e. the shared home).
ulimit -c 0
case "$SLURM_ROLE" in
  controller)
    if [ "${SLURM_ACCOUNTING:-0}" = 1 ]; then
      mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
      runuser -u mysql -- mariadbd --skip-networking >/var/log/mariadb.log 2>&1 &
      i=0; until mariadb -e 'select 1' >/dev/null 2>&1 || [ $i -ge 100 ]; do i=$((i+1)); sleep 0.1; done
      slurmdbd                        # daemonizes; slurmctld registers the cluster in it
      i=0; until sacctmgr -n list cluster >/dev/null 2>&1 || [ $i -ge 100 ]; do i=$((i+1)); sleep 0.1; done
    fi
    slurmctld ;;                      # daemonizes; runs as SlurmUser=slurm
  compute)    slurmd ;;               # daemonizes; NodeName = hostname
  *) echo "slurm-entrypoint: unknown SLURM_ROLE=$SLURM_ROLE" >&2; exit 1 ;;
esac
unset SLURM_ROLE SLURM_ACCOUNTING
exec /usr/local/sbin/node-entrypoint.sh
