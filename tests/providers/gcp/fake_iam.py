"""A small IAM + Resource Manager fake over HTTP for the controller's identity (issue 18).

Serves what provision/providers/gcp/controller.py calls, with the documented behaviour that
matters: service accounts (409 when the account id exists), custom roles (409 when the id
exists; a DELETED role's id cannot be used again: 400, "Create and manage custom roles": a
role ID cannot be reused for 37 days), the project's IAM policy with an etag (a stale etag is
409, "Policy versions": setIamPolicy with an old etag fails) and conditional bindings only in
policy version 3 (400 otherwise, "Policy versions"). Every request is captured (`requests`);
`fail(method, pattern, status)` injects an error.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeIam:
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)  # email -> account
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> role
    policy: dict[str, Any] = field(default_factory=lambda: {"version": 1, "bindings": [
        {"role": "roles/owner", "members": ["user:admin@example.com"]}], "etag": "e0"})
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    faults: list[tuple[str, re.Pattern[str], int]] = field(default_factory=list)
    url: str = ""

    def fail(self, method: str, pattern: str, status: int) -> None:
        self.faults.append((method, re.compile(pattern), status))

    def set_policies(self) -> list[dict[str, Any]]:
        return [b["policy"] for m, p, b in self.requests if p.endswith(":setIamPolicy")]

    # --- handlers -------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        for i, (m, pat, status) in enumerate(self.faults):
            if m == method and pat.search(path):
                del self.faults[i]
                return status, {"error": {"code": status, "message": "injected"}}
        if m := re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts", path):
            return self._accounts(method, m.group(1), body)
        if m := re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts/([^/]+)", path):
            if method == "DELETE":
                return (200, {}) if self.accounts.pop(m.group(2), None) else (404, {})
            if method == "GET":  # projects.serviceAccounts.get
                found = self.accounts.get(m.group(2))
                return (200, found) if found else (404, {})
        if m := re.fullmatch(r"/v1/projects/([^/]+)/roles", path):
            return self._roles(method, m.group(1), body)
        if re.fullmatch(r"/v1/projects/[^/]+/roles/[^/]+", path) and method == "GET":
            role = self.roles.get(path[len("/v1/"):])  # projects.roles.get: deleted ones too
            return (200, role) if role else (404, {})
        if re.fullmatch(r"/v1/projects/[^/]+/roles/[^/]+", path) and method == "DELETE":
            role = self.roles.get(path[len("/v1/"):])
            if role is None or role.get("deleted"):
                return 404, {}
            role["deleted"] = True
            return 200, role
        if path.endswith(":getIamPolicy"):
            return 200, self.policy
        if path.endswith(":setIamPolicy"):
            return self._set_policy(body["policy"])
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}

    def _accounts(self, method: str, project: str, body: Any) -> tuple[int, Any]:
        if method == "GET":
            return 200, {"accounts": list(self.accounts.values())}
        email = f"{body['accountId']}@{project}.iam.gserviceaccount.com"
        if email in self.accounts:
            return 409, {"error": {"code": 409, "status": "ALREADY_EXISTS"}}
        account = {"name": f"projects/{project}/serviceAccounts/{email}", "email": email,
                   "uniqueId": str(secrets.randbits(60)), **body["serviceAccount"]}
        self.accounts[email] = account
        return 200, account

    def _roles(self, method: str, project: str, body: Any) -> tuple[int, Any]:
        if method == "GET":
            return 200, {"roles": [r for r in self.roles.values() if not r.get("deleted")]}
        name = f"projects/{project}/roles/{body['roleId']}"
        if name in self.roles:
            deleted = self.roles[name].get("deleted")
            return (400, {"error": {"code": 400, "status": "FAILED_PRECONDITION"}}) if deleted \
                else (409, {"error": {"code": 409, "status": "ALREADY_EXISTS"}})
        role = {"name": name, **body["role"]}
        self.roles[name] = role
        return 200, role

    def _set_policy(self, policy: dict[str, Any]) -> tuple[int, Any]:
        if policy.get("etag") != self.policy["etag"]:
            return 409, {"error": {"code": 409, "status": "ABORTED"}}
        if any("condition" in b for b in policy.get("bindings", [])) and policy.get(
                "version") != 3:
            return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT"}}
        self.policy = {**policy, "etag": f"e{int(self.policy['etag'][1:]) + 1}"}
        return 200, self.policy

    # --- server ---------------------------------------------------------------------------
    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = self.path.split("?")[0]
                fake.requests.append((self.command, path, body))
                status, answer = fake.handle(self.command, path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve  # noqa: N815 - http.server's names

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.02,),  # stop() waits a poll
                         daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
