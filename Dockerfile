# Node image of the docker provider: sshd + a Python venv with CPU torch (and the launchers).
# Built by `mgpu-cloud image build` (and by `up` when missing); the tool assembles the build
# context: this file, node-entrypoint.sh and wheelhouse/ (wheels downloaded on the host, so the
# build itself never needs PyPI; apt packages come over http from Debian's mirrors).
# No registry? `mgpu-cloud image base` makes a Debian base with debootstrap and tags it.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS os
ENV DEBIAN_FRONTEND=noninteractive
# Install only what the base lacks (a debootstrap base already has most of it).
RUN set -e; missing=""; \
    for p in python3 python3-venv openssh-server iproute2 procps netcat-openbsd ca-certificates \
             pdsh g++ python3-dev ninja-build; do \
      dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; \
    done; \
    if [ -n "$missing" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $missing && \
      rm -rf /var/lib/apt/lists/*; \
    fi

FROM os AS builder
COPY wheelhouse /wheelhouse
RUN python3 -m venv /opt/venv && \
    /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
      -r /wheelhouse/requirements.txt

FROM os AS node
COPY --from=builder /opt/venv /opt/venv
# Docker ENV does not reach SSH sessions; /etc/environment does (pam_env).
RUN echo 'PATH="/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"' > /etc/environment && \
    mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh && \
    rm -f /etc/ssh/ssh_host_* && \
    printf '%s\n' \
      'HostKey /etc/ssh/ssh_host_ed25519_key' \
      'PermitRootLogin prohibit-password' \
      'PasswordAuthentication no' \
      'KbdInteractiveAuthentication no' \
      'UsePAM yes' \
      'MaxStartups 200:30:400' \
      'MaxSessions 100' \
      > /etc/ssh/sshd_config.d/mgpu-cloud.conf
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Prebuild DeepSpeed's CPU ops (communication, and the fused Adam that an AdamW config uses):
# otherwise every rank JIT-compiles them (minutes on small machines) the first time a job
# starts. Cached in /root/.cache/torch_extensions.
RUN python3 -c "from deepspeed.accelerator import get_accelerator as a; [a().create_op_builder(b).load() for b in ('ShareMemCommBuilder', 'FusedAdamBuilder')]" \
    && test -n "$(ls /root/.cache/torch_extensions/*/deepspeed_shm_comm/*.so)"
# No message of the day: Debian's pam_motd runs /etc/update-motd.d (run-parts, sh, uname) at
# the start of EVERY ssh session, commands included, and nobody reads it here (sshd prints
# none: PrintMotd no). 6 of a session's 36 ms of node CPU; ~2,900 sessions per test suite.
RUN sed -i 's/^session\s\+optional\s\+pam_motd\.so/# &/' /etc/pam.d/sshd \
    && ! grep -q '^session.*pam_motd' /etc/pam.d/sshd
# Last, so that editing it rebuilds one small layer (the tool makes it 0755 in the context).
COPY node-entrypoint.sh /usr/local/sbin/node-entrypoint.sh
EXPOSE 22
CMD ["/usr/local/sbin/node-entrypoint.sh"]
