"""The store credentials the nodes get: short-lived, narrowed to the run's data prefix.

Nodes run the user's code, so whatever reaches them may be read by it. They get, on the stdin
of each `remote.pyz store` command (never a file, never argv):

    s3://  STS credentials whose session policy allows objects under the run's data prefixes
           only (remote/storekeys.py: CLUSTER/data/jobs/ID/ read-write, a resumed run's
           CLUSTER/data/jobs/SRC/ read-only; an attached run CLUSTER/data/checkpoints/):
           GetFederationToken with long-lived IAM user keys (up to 36 h), else AssumeRole of
           MGPU_STORE_ROLE_ARN with the same session policy (1 h when chained); re-minted
           RENEW_S before they expire by whoever runs the keeper (the user's machine; the
           controller where it holds a minting identity). Never the user's own keys, except
           where nothing can narrow them (below), and then the plan says so.
    gs://  the emulator's endpoint only (STORAGE_EMULATOR_HOST; no credentials exist there);
           real Cloud Storage is refused for nodes at plan time (checks.check_node_credentials)
    file:// nothing: the node containers mount CLUSTER/data/ only (docker provider)

What cannot be narrowed (documented in docs/security.md): an S3-compatible endpoint with no
STS (AWS_ENDPOINT_URL_S3 set without AWS_ENDPOINT_URL_STS / AWS_ENDPOINT_URL), and temporary
keys (a session token: SSO, an assumed role) with no MGPU_STORE_ROLE_ARN; `broad` says why. A
managed run is then refused at plan time unless --allow-broad-node-credentials
(checks.refuse_broad); allowed, or in an attached run with --store, the nodes get the
shell's keys and it is said.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from provision.model.logsink import Log
from remote.store import StoreURL

KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
ROLE_VAR = "MGPU_STORE_ROLE_ARN"  # a role whose session the nodes' credentials narrow
STS_ENDPOINTS = ("AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL")
FEDERATION_MAX_S = 129600  # GetFederationToken: 15 min .. 36 h (IAM user credentials)
CHAINED_MAX_S = 3600  # AssumeRole from role credentials ("role chaining"): at most 1 h
MIN_S = 900
RENEW_S = 600.0  # re-minted this long before they expire
OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                  "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]


def session_policy(url: StoreURL, write: list[str], read: list[str]) -> dict[str, Any]:
    """The IAM session policy of a node's credentials: objects under `write` (read-write) and
    `read` (read-only), keys relative to `url`; listing only those prefixes."""
    def full(prefix: str) -> str:
        return "/".join(p for p in (url.prefix, prefix.strip("/")) if p) + "/"

    bucket = f"arn:aws:s3:::{url.bucket}"
    statements: list[dict[str, Any]] = [
        {"Effect": "Allow", "Action": OBJECT_ACTIONS,
         "Resource": [f"{bucket}/{full(p)}*" for p in write]},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket],
         "Condition": {"StringLike": {"s3:prefix": [f"{full(p)}*" for p in write + read]}}}]
    if read:
        statements.insert(1, {"Effect": "Allow", "Action": ["s3:GetObject"],
                              "Resource": [f"{bucket}/{full(p)}*" for p in read]})
    return {"Version": "2012-10-17", "Statement": statements}


def broad(url: StoreURL, env: dict[str, str]) -> str | None:
    """Why the nodes would get this shell's own keys for `url` (None: narrowed, or none)."""
    if url.scheme != "s3" or not env.get("AWS_ACCESS_KEY_ID"):
        return None
    if env.get("AWS_ENDPOINT_URL_S3") and not any(env.get(k) for k in STS_ENDPOINTS):
        return (f"the store's endpoint {env['AWS_ENDPOINT_URL_S3']} has no STS endpoint set "
                "(AWS_ENDPOINT_URL_STS) to narrow the nodes' keys with")
    if env.get("AWS_SESSION_TOKEN") and not env.get(ROLE_VAR):
        return (f"this shell's AWS keys are temporary (a session token) and no {ROLE_VAR} "
                "names a role to narrow them with")
    return None


class NodeCredentials:
    """The environment each node store command gets; minted on first use and again RENEW_S
    before expiry. `minted`: a bundle made elsewhere (the hand-off's, on the controller)
    used until it must be renewed; when this side cannot mint, it is used to its end.
    `note` hears once when the nodes get the shell's own keys (`broad`). Thread-safe."""

    def __init__(self, url: StoreURL, env: dict[str, str], *, write: list[str],
                 read: list[str] | None = None, duration_s: int = FEDERATION_MAX_S,
                 minted: dict[str, str] | None = None, name: str = "mgpu-node",
                 note: Log | None = None, sts: Any = None) -> None:
        self.url, self.env, self.write, self.read = url, dict(env), write, read or []
        self.duration_s, self.name, self._sts, self.note = duration_s, name, sts, note
        self._bundle = dict(minted) if minted else None
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, str]:
        with self._lock:
            if self._bundle is None or (self._expiring() and self.can_mint()):
                self._bundle = self._mint()
            return dict(self._bundle)

    def _expiring(self) -> bool:
        until = (self._bundle or {}).get("MGPU_STORE_EXPIRES")
        if not until:
            return False
        left = dt.datetime.fromisoformat(until) - dt.datetime.now(dt.UTC)
        return left.total_seconds() < RENEW_S

    def can_mint(self) -> bool:
        return self.url.scheme == "s3" and bool(self.env.get("AWS_ACCESS_KEY_ID")
                                                or self.env.get(ROLE_VAR))

    def _mint(self) -> dict[str, str]:
        base = {k: v for k, v in self.env.items() if k not in KEYS and k != ROLE_VAR}
        if self.url.scheme != "s3":
            return base
        why = broad(self.url, self.env)
        if why is not None:
            if self.note is not None:
                self.note(f"the nodes get this shell's own AWS keys for {self.url}: {why}")
                self.note = None
            return {**base, **{k: self.env[k] for k in KEYS if self.env.get(k)}}
        if not self.can_mint():
            return base  # nothing to narrow: the nodes get no credentials
        creds = self._request(session_policy(self.url, self.write, self.read))
        return {**base, "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
                "AWS_SESSION_TOKEN": creds["SessionToken"],
                "MGPU_STORE_EXPIRES": _iso(creds["Expiration"])}

    def _request(self, policy: dict[str, Any]) -> dict[str, Any]:
        import json

        sts = self._sts or sts_client(self.env)
        text = json.dumps(policy, separators=(",", ":"))
        if self.env.get("AWS_ACCESS_KEY_ID") and not self.env.get("AWS_SESSION_TOKEN"):
            secs = max(MIN_S, min(FEDERATION_MAX_S, self.duration_s))
            out = sts.get_federation_token(Name=self.name[:32], Policy=text,
                                           DurationSeconds=secs)
        else:
            secs = max(MIN_S, min(CHAINED_MAX_S, self.duration_s))
            out = sts.assume_role(RoleArn=self.env[ROLE_VAR], RoleSessionName=self.name[:64],
                                  Policy=text, DurationSeconds=secs)
        return dict(out["Credentials"])


def sts_client(env: dict[str, str]) -> Any:
    """An STS client with the credentials and endpoint of `env` (not this process's)."""
    import boto3

    endpoint = next((env[k] for k in STS_ENDPOINTS if env.get(k)), None)
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    keys = {"aws_access_key_id": env.get("AWS_ACCESS_KEY_ID"),
            "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "aws_session_token": env.get("AWS_SESSION_TOKEN")}
    return boto3.client("sts", region_name=region, endpoint_url=endpoint,
                        **{k: v for k, v in keys.items() if v})


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).isoformat()
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).isoformat()



def for_job(url: StoreURL, cluster: str, job_id: str, env: dict[str, str], *,
            resume_from: str | None = None, minted: dict[str, str] | None = None,
            duration_s: int = FEDERATION_MAX_S,
            note: Log | None = None) -> NodeCredentials:
    """A managed run's node credentials: CLUSTER/data/jobs/ID/ (checkpoints, outputs), and
    the resumed run's folder to read."""
    from remote.storekeys import job_data

    return NodeCredentials(url, env, write=[job_data(cluster, job_id)],
                           read=[job_data(cluster, resume_from)] if resume_from else [],
                           duration_s=duration_s, minted=minted,
                           name=f"mgpu-{cluster}-{job_id}", note=note)
