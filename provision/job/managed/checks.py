"""Plan-time checks of a managed run: refused before anything is created.

    the store URL parses                       (spec.py already; repeated for `attach --store`)
    the provider's nodes can reach it          file:// only where every node mounts the folder
                                               (docker: a host folder bind-mounted); an endpoint
                                               on this machine's loopback is not reachable
                                               from docker nodes, nor anything private from
                                               cloud nodes
    it exists and we may write there           a probe object written, read and deleted
    the nodes will have credentials for it     aws/gcp: AWS keys as variables for s3:// (a
                                               profile/SSO login stays here); gs:// not yet
    --notify is http(s)                        spec.py
    MGPU_RESUME_FROM names a run with          check_resume
    checkpoints
(A --detach job without a store is refused supervision flags in provision/job/detached.py.)
The SDKs' errors are classified once here, by error code (botocore's Error.Code, the HTTP
status of google.api_core), never by message text.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from urllib.parse import urlparse

from provision.job.managed.records import RESUME_VAR, JobView, job_ids
from provision.job.managed.signing import local_key
from provision.model.errors import (
    LaunchError,
    MgpuError,
    ProviderUnavailableError,
    UserInputError,
)
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from remote.store import StoreURL, open_store, parse_url
from remote.storekeys import UnsafeKey, job_data

# What reaches a store from a node or the controller (remote/store.py --env-stdin). The SDKs'
# own variable names: credentials (where no instance role is used) and endpoints.
STORE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
             "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
             "AWS_ENDPOINT_URL_STS", "MGPU_STORE_ROLE_ARN",
             "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Providers whose nodes get the store's credentials only from this shell's variables
OWN_IDENTITY = ("aws", "gcp")
FILE_STORE_PROVIDERS = ("docker", "ssh", "slurm")  # nodes that can share a folder with us
NO_WRITE = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"}
NO_BUCKET = {"NoSuchBucket", "404"}


def store_env(env: dict[str, str] | None = None) -> dict[str, str]:
    source = os.environ if env is None else env
    return {k: source[k] for k in STORE_ENV if source.get(k)}


def controller_env(provider: str, env: dict[str, str]) -> dict[str, str]:
    """What the supervisor puts in its own environment: on aws not the user's AWS keys, so
    its EC2 calls and its s3:// client run as the controller's own, cluster-scoped instance
    profile (the nodes still get `env`). A gcp controller keeps them: its service account
    covers Compute and gs://, not an s3:// store; neither does the profile cover an
    S3-compatible store of another endpoint (its keys are kept then)."""
    if provider != "aws" or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
        return dict(env)
    return {k: v for k, v in env.items() if k not in CREDENTIAL_ENV}


def check_node_credentials(provider: str, url: StoreURL, env: dict[str, str]) -> None:
    """The cloud nodes push checkpoints with the store variables of this shell (STORE_ENV):
    refuse a store they would have no credentials for."""
    if provider not in OWN_IDENTITY:
        return
    if url.scheme == "s3" and not (env.get("AWS_ACCESS_KEY_ID")
                                   and env.get("AWS_SECRET_ACCESS_KEY")):
        raise UserInputError(
            f"--store {url}: the {provider} nodes push checkpoints with this shell's AWS keys, "
            "and none are set as variables (AWS_PROFILE / SSO credentials stay on this "
            "machine)",
            hint='export them first: eval "$(aws configure export-credentials --format env)"; '
                 "the nodes never get them: they get STS credentials narrowed to the run's "
                 "folder (temporary keys need MGPU_STORE_ROLE_ARN, a role to narrow them with)")
    if url.scheme == "gs" and not env.get("STORAGE_EMULATOR_HOST"):
        raise UserInputError(
            f"--store {url}: {provider} nodes get no Cloud Storage credentials yet (no "
            "service account of their own, and key files do not travel)",
            hint="use an s3:// store with AWS keys exported, or run without --store")


# The SDK remote/store.py imports ON a node for each scheme (module, pip name)
NODE_SDK = {"s3": ("boto3", "boto3"), "gs": ("google.cloud.storage", "google-cloud-storage")}


def node_sdk_probe(url: StoreURL) -> str | None:
    """The shell line that fails on a node whose python3 cannot push to `url` (None: file://
    needs nothing)."""
    import shlex

    sdk = NODE_SDK.get(url.scheme)
    return None if sdk is None else f"python3 -c {shlex.quote('import ' + sdk[0])}"


def endpoint_of(url: StoreURL, env: dict[str, str]) -> str | None:
    if url.scheme == "s3":
        return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if url.scheme == "gs":
        return env.get("STORAGE_EMULATOR_HOST")
    return None


def check_reach(provider: str, url: StoreURL, env: dict[str, str]) -> None:
    """UserInputError when the provider's nodes cannot reach the store."""
    if url.scheme == "file":
        if provider not in FILE_STORE_PROVIDERS:
            raise UserInputError(
                f"--store {url}: {provider} nodes cannot mount a folder of this machine",
                hint="use an s3:// or gs:// store, or a file:// path on a filesystem the "
                     "nodes mount (docker, ssh, slurm)")
        if not os.path.isdir(url.prefix):
            raise UserInputError(f"--store {url}: {url.prefix} is not a folder here",
                                 hint=f"create it first: mkdir -p {url.prefix}")
        return
    endpoint = endpoint_of(url, env)
    if not endpoint:
        return
    host = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}").hostname or ""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: resolved where it is used
    if addr.is_loopback:
        raise UserInputError(
            f"--store {url}: its endpoint {endpoint} is this machine's loopback, which the "
            f"{provider} nodes cannot reach",
            hint="serve it on an address the nodes reach (docker: the docker0 bridge's "
                 "address, e.g. 172.17.0.1)")
    if addr.is_private and provider in ("aws", "gcp"):
        raise UserInputError(f"--store {url}: endpoint {endpoint} is a private address "
                             f"that {provider} nodes cannot reach")


def check_writable(url: StoreURL) -> None:
    """Write, read and delete a probe object; a clear error when any of it fails."""
    key = f".mgpu-probe-{secrets.token_hex(4)}"
    try:
        store = open_store(url)
        store.put_bytes(key, b"probe")
        if store.get_bytes(key) != b"probe":
            raise MgpuError(f"--store {url}: a probe object written there cannot be read back")
        store.delete(key)
    except MgpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below, by code
        raise _classify(url, exc) from exc


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        return str(response.get("Error", {}).get("Code", ""))
    status = getattr(exc, "code", None)  # google.api_core.exceptions.GoogleAPICallError
    return str(status) if isinstance(status, int) else ""


def _classify(url: StoreURL, exc: Exception) -> MgpuError:
    code = _code(exc)
    if isinstance(exc, PermissionError) or code in NO_WRITE:
        return UserInputError(
            f"--store {url}: no permission to write there ({code or exc})",
            hint="grant this identity s3:PutObject/GetObject/DeleteObject/ListBucket (GCS: "
                 "roles/storage.objectAdmin) on that bucket and prefix")
    if isinstance(exc, FileNotFoundError) or code in NO_BUCKET:
        return UserInputError(f"--store {url}: the bucket {url.bucket or url.prefix!r} does not "
                              "exist", hint="create it first, or fix the URL")
    return ProviderUnavailableError(
        f"--store {url}: the store cannot be reached ({type(exc).__name__}: {exc})",
        hint="check the endpoint (AWS_ENDPOINT_URL_S3 / STORAGE_EMULATOR_HOST), the network "
             "and the credentials")


def refuse_broad(url: StoreURL, env: dict[str, str], *, allowed: bool, log: Log) -> None:
    """A managed run whose nodes would get this shell's own AWS keys (nodecreds.broad:
    nothing can narrow them) is refused, saying why and what narrows them, unless `allowed`
    (--allow-broad-node-credentials): then it is said once and the run goes on."""
    from provision.job.managed.nodecreds import ROLE_VAR, broad

    why = broad(url, env)
    if why is None:
        return
    if allowed:
        log(f"--allow-broad-node-credentials: the nodes get this shell's own AWS keys for "
            f"{url} ({why}); every node, and the code it runs, can use them")
        return
    fix = (f"set {ROLE_VAR} to a role these keys may assume (the nodes then get its "
           "session, narrowed to the run's folder), or use an IAM user's long-lived keys "
           "(narrowed with GetFederationToken)" if env.get("AWS_SESSION_TOKEN") else
           "set AWS_ENDPOINT_URL_STS to the store's STS endpoint (MinIO and Ceph RGW serve "
           "AssumeRole), so the nodes' keys are narrowed to the run's folder")
    raise UserInputError(
        f"--store {url}: the nodes would get this shell's own AWS keys: {why}; a node, and "
        "any code it runs, could then read and write everything those keys reach",
        hint=f"{fix}; or pass --allow-broad-node-credentials to accept it")


def check_store(provider: str, store_url: str, env: dict[str, str] | None = None) -> StoreURL:
    """Everything about `--store` that can be checked before anything is created."""
    try:
        url = parse_url(store_url)
    except ValueError as exc:
        raise UserInputError(f"--store: {exc}") from None
    env = store_env() if env is None else env
    check_reach(provider, url, env)
    check_node_credentials(provider, url, env)
    check_writable(url)
    return url


def check_resume(inv_name: str, url: str, job: JobSpec) -> None:
    """`--env MGPU_RESUME_FROM=ID`: run ID of this cluster must have checkpoints in the store
    (UserInputError before anything is handed over otherwise)."""
    source = job.env.get(RESUME_VAR)
    if not source:
        return
    try:
        prefix = job_data(inv_name, source)
    except UnsafeKey as exc:
        raise UserInputError(f"{RESUME_VAR}={source}: {exc}") from None
    objects = open_store(url)
    if not objects.list(f"{prefix}/checkpoints"):
        key = local_key(InventoryStore().keys_dir(inv_name))
        known = ", ".join(job_ids(objects, inv_name, key)) or "none"
        raise UserInputError(
            f"{RESUME_VAR}={source}: job {source} of {inv_name!r} has no checkpoints in {url}",
            hint=f"jobs there: {known} (`mgpu-cloud jobs {inv_name}`); leave {RESUME_VAR} out "
                 "to start fresh")


def refuse_if_running(inv: Inventory) -> None:
    """One managed job at a time per cluster (like attached jobs)."""
    if not inv.spec or not inv.spec.store:
        return
    objects = open_store(inv.spec.store)
    key = local_key(InventoryStore().keys_dir(inv.name))
    ids = job_ids(objects, inv.name, key)
    if not ids:
        return
    records = JobView(objects, inv.name, ids[-1], key).records()
    if records and records[-1].state not in ("succeeded", "failed", "cancelled"):
        raise LaunchError(f"managed job {ids[-1]} is still {records[-1].state} on "
                          f"{inv.name!r}", hint=f"mgpu-cloud cancel {inv.name} {ids[-1]}")
