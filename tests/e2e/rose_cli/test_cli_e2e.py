"""`rose version` against the real API server of the local cluster: the server half is its /version."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from kubernetes import client

from local_cluster import ClusterHandle


def test_rose_version_shows_the_api_servers_version(cluster: ClusterHandle, api: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rose_cli", "version", "--kubeconfig", str(cluster.kubeconfig), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = client.VersionApi(api).get_code()
    assert out["server"]["gitVersion"] == want.git_version and out["server"]["platform"] == want.platform
    assert out["client"]["version"]
