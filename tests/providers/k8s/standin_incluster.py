"""What a process in a pod meets when it calls the API server as the pod's ServiceAccount
(the k8s controller pod), and RBAC as the API server applies it.

    serve_tls(host)   the API over HTTPS on `host` (an address the pod containers reach: this
                      machine's docker0 address), with a CA of its own; the kubelet writes
                      that CA into the pod as ca.crt and sets KUBERNETES_SERVICE_HOST/PORT in
                      every container (kubernetes pkg/kubelet/kubelet_pods.go
                      getServiceEnvVarMap: the `kubernetes` service's variables are always
                      set, enableServiceLinks or not)
    admit_pod         the ServiceAccount admission plugin (kubernetes plugin/pkg/admission/
                      serviceaccount/admission.go): spec.serviceAccountName defaults to
                      `default`; a named ServiceAccount must exist (403 "error looking up
                      service account"); unless automountServiceAccountToken is false (the
                      pod's field first, then the ServiceAccount's), a projected volume
                      kube-api-access-XXXXX (token, ca.crt, namespace) is mounted read-only at
                      /var/run/secrets/kubernetes.io/serviceaccount in every container
    mint / identify   the kubelet asks a token for the pod (TokenRequest); it is valid while
                      that pod exists with that uid (bound tokens: kubernetes
                      pkg/serviceaccount/claims.go checks the bound pod), as
                      system:serviceaccount:NS:NAME
    authorize         a ServiceAccount's request is allowed only by the Roles its RoleBindings
                      in its namespace grant (rbac.allows); else 403 Forbidden with the API's
                      message (apiserver endpoints/handlers/responsewriters/errors.go)
    escalation        the user may create a Role only with permissions it holds itself, and a
                      RoleBinding only to such a Role (kubernetes pkg/registry/rbac/validation
                      ConfirmNoEscalation: "attempting to grant RBAC permissions not currently
                      held"); the user holds the Role of docs/kubernetes.md
    cluster scope     a namespace's Role grants nothing cluster-scoped: with
                      `user_cluster_rules` set, the user's reads of cluster-scoped objects
                      (Kueue's WorkloadPriorityClasses) need a ClusterRole that allows them
"""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import secrets
import ssl
import tarfile
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import rbac
from standin_store import ApiError

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RBAC_GROUP = "rbac.authorization.k8s.io"
ROLES, BINDINGS = f"{RBAC_GROUP}/v1/roles", f"{RBAC_GROUP}/v1/rolebindings"


class InCluster:
    def __init__(self, api: Any) -> None:
        self.api = api
        self.tokens: dict[str, tuple[str, str, str, str]] = {}  # token -> ns, sa, pod, uid
        self.endpoint: tuple[str, int] | None = None
        # the user's ClusterRole rules for cluster-scoped objects (a test sets them; None:
        # not judged): with only the namespace's Role of the docs, a user reads none
        self.user_cluster_rules: list[dict[str, Any]] | None = None
        self.ca_pem = b""
        self._server: ThreadingHTTPServer | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="k8s-standin-tls-")

    # --- the HTTPS listener pods reach --------------------------------------------------------
    def serve_tls(self, host: str, handler: Any) -> None:
        cert, key = self._certificates(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server = ThreadingHTTPServer((host, 0), handler)
        server.daemon_threads = True
        server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
        self._server = server
        self.endpoint = (host, int(server.server_address[1]))
        threading.Thread(target=server.serve_forever, args=(0.02,),  # shutdown waits a poll
                         daemon=True).start()

    def _certificates(self, host: str) -> tuple[str, str]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        now = dt.datetime.now(dt.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(name("standin-ca"))
              .issuer_name(name("standin-ca")).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now)
              .not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        alt = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)),
                                           x509.DNSName("kubernetes.default.svc")])
        cert = (x509.CertificateBuilder().subject_name(name("kube-apiserver"))
                .issuer_name(ca.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now)
                .not_valid_after(now + dt.timedelta(days=1)).add_extension(alt, critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_pem = ca.public_bytes(serialization.Encoding.PEM)
        folder = Path(self._folder.name)
        (folder / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / "server.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return str(folder / "server.crt"), str(folder / "server.key")

    def env(self) -> dict[str, str]:
        """What the kubelet sets in every container (empty: no listener pods reach)."""
        if self.endpoint is None:
            return {}
        host, port = self.endpoint
        return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port)}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._folder.cleanup()

    # --- ServiceAccount admission ---------------------------------------------------------------
    def admit_pod(self, ns: str, pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        sa_name = spec.setdefault("serviceAccountName", "default")
        sa: dict[str, Any] = {}
        if sa_name != "default":  # the ServiceAccount controller makes `default` everywhere
            try:
                sa = self.api.store.get("serviceaccounts", ns, sa_name)
            except ApiError:
                raise ApiError(403, "Forbidden", f'pods "{pod["metadata"].get("name", "")}" '
                               f"is forbidden: error looking up service account "
                               f'{ns}/{sa_name}: serviceaccount "{sa_name}" not found') from None
        mount = spec.get("automountServiceAccountToken")
        if mount is None:
            mount = sa.get("automountServiceAccountToken", True)
        if not mount:
            return
        volume = f"kube-api-access-{secrets.token_hex(3)[:5]}"
        spec.setdefault("volumes", []).append({"name": volume, "projected": {
            "defaultMode": 0o644, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
        for c in spec["containers"]:
            if not any(m.get("mountPath") == SA_DIR for m in c.get("volumeMounts", [])):
                c.setdefault("volumeMounts", []).append(
                    {"name": volume, "mountPath": SA_DIR, "readOnly": True})

    # --- tokens ---------------------------------------------------------------------------------
    def project(self, docker: Any, cid: str, pod: dict[str, Any]) -> None:
        """The kubelet's part: a projected token volume's files written into the container."""
        meta = pod["metadata"]
        for vol in pod["spec"].get("volumes", []):
            sources = vol.get("projected", {}).get("sources", [])
            if not any("serviceAccountToken" in s for s in sources):
                continue
            token = self.mint(meta["namespace"], pod["spec"]["serviceAccountName"],
                              meta["name"], meta["uid"])
            files = {"token": token.encode(), "ca.crt": self.ca_pem,
                     "namespace": meta["namespace"].encode()}
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for name, data in files.items():
                    info = tarfile.TarInfo(f"{SA_DIR.strip('/')}/{name}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
            docker.put_archive(cid, "/", buf.getvalue())

    def mint(self, ns: str, sa: str, pod: str, uid: str) -> str:
        """A token of ServiceAccount `sa` bound to pod `pod` (uid `uid`)."""
        token = secrets.token_urlsafe(24)
        self.tokens[token] = (ns, sa, pod, uid)
        return token

    def identify(self, auth: str) -> str | None:
        scheme, _, token = auth.partition(" ")
        bound = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if bound is None:
            return None
        ns, sa, pod, uid = bound
        try:
            if self.api.store.get("pods", ns, pod)["metadata"]["uid"] != uid:
                return None
        except ApiError:
            return None  # the pod it is bound to is gone: the token is no longer valid
        return f"system:serviceaccount:{ns}:{sa}"

    # --- RBAC -----------------------------------------------------------------------------------
    def authorize(self, who: str, method: str, path: str, query: dict[str, str],
                  body: Any) -> None:
        """ApiError 403 for a request RBAC does not allow (a ServiceAccount's), or a Role or
        RoleBinding the user may not create."""
        attrs = rbac.attributes(method, path, query)
        if attrs is None:
            return
        group, resource, verb, name = attrs
        if who.startswith("system:serviceaccount:"):
            ns = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else ""
            if not rbac.allows(self.rules_of(who, ns), group, resource, verb, name):
                what = f'{resource} "{name}"' if name else resource
                raise ApiError(403, "Forbidden",
                               f'{what} is forbidden: User "{who}" cannot {verb} resource '
                               f'"{resource}" in API group "{group}"'
                               + (f' in the namespace "{ns}"' if ns else " at the cluster scope"))
        elif who == "user" and verb == "create" and group == RBAC_GROUP:
            self._no_escalation(resource, path, body)
        elif who == "user" and "/namespaces/" not in path and self.user_cluster_rules \
                is not None and not rbac.allows(self.user_cluster_rules, group, resource,
                                                verb, name):
            raise ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: User '
                                             f'"standin" cannot {verb} resource "{resource}" in '
                                             f'API group "{group}" at the cluster scope')

    def rules_of(self, who: str, ns: str) -> list[dict[str, Any]]:
        _, _, sa_ns, sa = who.split(":")
        rules: list[dict[str, Any]] = []
        for rb in self.api.store.list(BINDINGS, ns):
            if any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                   and s.get("namespace", ns) == sa_ns for s in rb.get("subjects", [])) \
                    and rb["roleRef"]["kind"] == "Role":
                try:
                    rules += self.api.store.get(ROLES, ns, rb["roleRef"]["name"])["rules"]
                except ApiError:
                    pass  # a binding to a Role that is gone grants nothing
        return rules

    def _no_escalation(self, resource: str, path: str, body: Any) -> None:
        ns = path.split("/namespaces/")[1].split("/")[0]
        if resource == "rolebindings":
            try:
                granted = self.api.store.get(ROLES, ns, body["roleRef"]["name"])["rules"]
            except ApiError:
                granted = []
        else:
            granted = body.get("rules", [])
        held = rbac.role()["rules"]
        extra = [r for r in granted if not _covered(held, r)]
        if extra:
            raise ApiError(403, "Forbidden",
                           f'{resource}.{RBAC_GROUP} "{body["metadata"]["name"]}" is forbidden: '
                           'user "standin" is attempting to grant RBAC permissions not '
                           f"currently held: {extra}")


def _covered(held: list[dict[str, Any]], rule: dict[str, Any]) -> bool:
    names = rule.get("resourceNames") or [None]
    return all(rbac.allows(held, g, r, v, n) for g in rule.get("apiGroups", [])
               for r in rule.get("resources", []) for v in rule.get("verbs", [])
               for n in names)
