"""Kubernetes provider: each node is a pod (all of a machine's GPUs), made as one JobSet when
the cluster serves jobset.x-k8s.io, as plain pods + a headless Service otherwise.

Cheap to import (the CLI reads INFO at start-up): the kubernetes client is imported only when
used. docs/kubernetes.md says what was run against a real cluster and what only against the
stand-in in tests/providers/k8s/.
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="k8s",
    summary="pods on a Kubernetes cluster (JobSet or plain pods; Kueue queues)",
    options="provision.cluster.providers.k8s.options:K8sOptions",
    implementation="provision.cluster.providers.k8s.provider:K8sProvider",
    # Quota in a shared cluster, not dollars this tool could show (like slurm).
    costs_money=False,
    connector="provision.cluster.providers.k8s.transport:connector",
    proxy="provision.cluster.providers.k8s.relay:proxy_argv",
    # PID 1 of a pod is its start shell: USR1 ends the pod Succeeded (manifests.START), its
    # index complete; it stops holding the namespace's quota. (TERM, what a deletion,
    # eviction or preemption sends, ends it Failed: its index gets a new pod.)
    self_stop="kill -USR1 1",
    self_stop_note="each pod ends itself (Succeeded) and stops counting against the "
                   "namespace's quota; `down` deletes the cluster's objects and its inventory",
    monitor_note="CPU, memory and load are those of the machine each pod runs on (a pod "
                 "reads its node's /proc)",
    flags=(
        Flag("--namespace", "namespace", help="Kubernetes namespace (default: default)", gc=True),
        Flag("--context", "context", help="kubeconfig context (default: the current one)",
             gc=True),
        Flag("--queue", "queue", help="Kueue LocalQueue: made suspended, waits to be admitted"),
        Flag("--priority", "priority",
             help="Kueue WorkloadPriorityClass (with --queue): who may preempt whom"),
        Flag("--pod-image", "image",
             help="the pods' image: sshd + python3.11 (default: $MGPU_CLOUD_K8S_IMAGE)"),
        Flag("--k8s-api", "api", help="auto (JobSet when installed) | jobset | pods"),
        Flag("--fabric", "fabric", help="none | efa (EKS) | tcpx | tcpxo | rdma (GKE)"),
        Flag("--node-type", "node_type",
             help="GPU machine type of the nodes (p5.48xlarge, a3-megagpu-8g): CPU/memory asks"),
        Flag("--placement", "placement",
             help="KEY=VALUE[,KEY=VALUE] node labels every pod must have"),
        Flag("--topology", "topology",
             help="Kueue TAS level the pods must share, e.g. cloud.google.com/gce-topology-block"),
    ),
)
