"""GPU shares over the extender's real HTTP server (issue 27 §3): a pending RL worker whose
template-generated claim asks for a share is judged in shares, with the static-file forecast
backend; the verdicts and the metric say so."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from rose_common.forecast_client import StaticFileForecastSource
from scheduler_extender import policy
from scheduler_extender.forecast import ForecastCache
from scheduler_extender.server import METRICS_ROUTES, Extender, ExtenderServer
from tests.support.extender_fixtures import T0, args_body, claim, forecast, pod, share_cache, share_claim, share_pod

GIB = 2**30


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_share_worker_judged_in_shares_over_http(tmp_path: Path) -> None:
    """Pool "p": n1 and n2, 2 GPUs each (80 GiB). Serving holds n1's GPU 1 and both of n2's;
    n1's GPU 0 carries a 40 GiB + 50 % share. The forecast keeps 3 GPUs for serving for the hour:
    no whole GPU is left for a worker of whole GPUs, while a 20 GiB + 25 % share fits n1's shared
    GPU (4 - 3 - 0.5 = 0.5 of a GPU). Pool "busy" (forecast 2 of 2) refuses the share with the
    shares verdict."""
    path = tmp_path / "forecasts.json"
    items = [forecast("p", {600: 3, 1800: 3, 3600: 3}), forecast("busy", {600: 2, 3600: 2})]
    path.write_text(json.dumps({"forecasts": [json.loads(f.model_dump_json()) for f in items]}))
    fc = ForecastCache(StaticFileForecastSource(path), quantile="0.9", refresh_s=60, max_age_s=60)
    fc.want(["p", "busy"])
    fc.refresh_once()
    objects = [
        ("ResourceClaim", claim("ns", "s1", "n1", ["gpu-1-serving"])),
        ("ResourceClaim", claim("ns", "s2", "n2", ["gpu-0-serving", "gpu-1-serving"])),
        ("ResourceClaim", share_claim("ns", "other", "40Gi", "50", [("n1", "gpu-0-share", 40 * GIB, 50)])),
        ("ResourceClaim", share_claim("ns", "w-gpu-abc", "20Gi", "25")),  # the pending worker's, unallocated
    ]
    cache = share_cache({"p": ["n1", "n2"], "busy": ["b1"]}, gpus=2, objects=objects)
    ext = Extender(cache, forecasts=fc, cfg=policy.PolicyConfig(default_min_run_s=600), clock=T0.timestamp)
    srv = ExtenderServer(ext, "127.0.0.1", 0).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        worker = share_pod("w", "u-w", "w-gpu-abc", ns="ns")
        code, reply = _post(conn, "/filter", args_body(worker, ["n1", "n2", "b1"]))
        assert code == 200
        assert reply["NodeNames"] == ["n1"]
        bad = reply["FailedAndUnresolvableNodes"]
        assert bad["n2"].startswith("no room for a share of 20 GiB + 25 % on one GPU")
        assert "counted in shares: 2 GPUs, serving in whole GPUs" in bad["b1"]
        # the same worker claiming a whole GPU (a claim the cache has no share request for): no node
        whole = pod("x", "u-x", ns="ns", job="j")
        code, reply = _post(conn, "/filter", args_body(whole, ["n1", "n2", "b1"]))
        assert (code, reply["NodeNames"]) == (200, [])
        assert reply["FailedAndUnresolvableNodes"]["n1"] == "0 lendable GPUs free, pod needs 1"
        code, scores = _post(conn, "/prioritize", args_body(worker, ["n1", "n2", "b1"]))
        by_host = {s["Host"]: s["Score"] for s in scores}
        # n1: the hour-long window; b1: room for the share twice but no window; n2: no room at all
        assert code == 200 and by_host["n1"] > by_host["b1"] > by_host["n2"] == 0
    finally:
        conn.close()
        srv.stop()
    msrv = ExtenderServer(ext, "127.0.0.1", 0, routes=METRICS_ROUTES).start()  # the metrics listener
    mconn = http.client.HTTPConnection("127.0.0.1", msrv.port, timeout=5)
    try:
        mconn.request("GET", "/metrics")
        text = mconn.getresponse().read().decode()
    finally:
        mconn.close()
        msrv.stop()
    assert "rose_extender_share_calls_total 2.0" in text  # the share worker's filter and prioritize
