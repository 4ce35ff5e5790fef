"""The "SLO vs RL throughput" dashboard against a real Prometheus scraping the real components.

Scenario: demo act 4's (rose_cli.demo_elastic) — ``rose driver`` per node of the lent pool
(simulated GPUs, node suspend engine, node agent), ``rose extender`` behind the rose-scheduler
profile, ``rose controller``, an ElasticRLJob that grows, is shrunk and gang-suspended before
serving needs its GPUs, meets a serving pod, resumes and regrows, its first worker a real training
process (examples/01_cartpole_reinforce.py) reporting steps and samples through the driver's node
agent — plus ``rose predictor serve`` ingesting the recording rule ``rose_serving_busy_gpus``
(manifests/prometheus/rules.yaml) from the same Prometheus (Debian's ``prometheus`` package),
which scrapes every process each second.

Stand-in, named: ``VllmStandInExporter`` serves vLLM's metric names
(``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:num_requests_waiting``) with synthetic values, since no vLLM runs here; Prometheus adds
the ``pool`` label as manifests/prometheus/scrape-configs.yaml does for serving pods.

The time-slice orchestrator runs as ``rose timeslice serve --store memory`` (the explicit
one-process store; no device state moves with its ``noop`` hand-over; TLS, but without a cluster
no TokenReview or job check: ``--insecure`` for those two), two job threads taking turns on one
group through real gRPC Acquire / Yield for the whole scenario.

Then every panel query of the dashboard (interpolated with the variables' defaults, as Grafana
sends it) must return a series, and ``rose dashboard preview`` renders them to a PNG (set
``ROSE_DASHBOARD_PREVIEW_OUT`` to keep it, e.g. docs/dashboard-preview.png).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster import ClusterHandle, free_port, module_process
from local_cluster.objects import delete_namespace, new_namespace, wait_for
from rose_cli import dashboard
from rose_cli import demo_elastic as act
from rose_cli.demo_elastic import kubectl
from tests.support.cluster_fixtures import session_shaped_cluster
from tests.support.erj_manifests import elastic_rl_job
from tests.support.prometheus_fixtures import MetricsStandIn, prometheus

RULES = Path(__file__).resolve().parents[3] / "manifests" / "prometheus" / "rules.yaml"
_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
_E2E_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, float("inf"))


class VllmStandInExporter(MetricsStandIn):
    """A stand-in for vLLM's /metrics (no vLLM runs here): a steady request stream whose latency
    histograms and queue follow a slow sine, so the series move."""

    def __init__(self) -> None:
        self.t0 = time.time()
        super().__init__(lambda: self.render(time.time() - self.t0))

    @staticmethod
    def _histogram(name: str, buckets: tuple[float, ...], n: float, typical: float) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        for le in buckets:
            share = 1.0 if math.isinf(le) else 1 - math.exp(-le / typical)
            lines.append(
                f'{name}_bucket{{le="{"+Inf" if math.isinf(le) else le}",model_name="stand-in"}} {n * share:.3f}'
            )
        lines += [
            f'{name}_sum{{model_name="stand-in"}} {n * typical:.3f}',
            f'{name}_count{{model_name="stand-in"}} {n:.3f}',
        ]
        return lines

    def render(self, t: float) -> str:
        n = 20.0 * t  # 20 requests per second
        load = 1 + 0.5 * math.sin(t / 20)
        lines = self._histogram("vllm:time_to_first_token_seconds", _TTFT_BUCKETS, n, 0.12 * load)
        lines += self._histogram("vllm:e2e_request_latency_seconds", _E2E_BUCKETS, n, 2.0 * load)
        lines += [
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="stand-in"}} {3 * load:.2f}',
        ]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """A cluster of its own: the scenario's drivers leave their ResourceSlices and its extender
    answers for the rose-scheduler profile, which would change what later tests see."""
    with session_shaped_cluster(tmp_path_factory.mktemp("dashboard-cluster")) as c:
        yield c


def _prometheus_config(targets: dict[str, list[str]], serving_pool: str, vllm_port: int) -> dict[str, Any]:
    # honor_labels as manifests/prometheus/scrape-configs.yaml: the RL job's `job` label is kept
    jobs = [
        {"job_name": job, "honor_labels": True, "static_configs": [{"targets": addrs}]}
        for job, addrs in targets.items()
    ]
    vllm = {"targets": [f"127.0.0.1:{vllm_port}"], "labels": {"pool": serving_pool}}
    jobs.append({"job_name": "serving-vllm", "static_configs": [vllm]})
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "rule_files": [str(RULES)],
        "scrape_configs": jobs,
    }


def _predictor(tmp: Path, prom_url: str, pool: str, port: int) -> list[str]:
    pools = tmp / "pools.yaml"
    pools.write_text(
        yaml.safe_dump(
            {
                "pools": [
                    {
                        "name": pool,
                        "query": f'sum(rose_serving_busy_gpus{{pool="{pool}"}})',
                        "unit": "gpus",
                        "capacity": 4,
                    }
                ]
            }
        )
    )
    return [
        "predictor",
        "serve",
        f"--pools={pools}",
        f"--listen=127.0.0.1:{port}",
        f"--prometheus-url={prom_url}",
        "--step=1s",
        "--history=1h",
        "--horizons=10s,30s",
        "--quantiles=0.9",
        "--refresh-interval=1s",
        "--season-day=144s",
        "--season-week=1008s",
    ]


@contextlib.contextmanager
def timeslice_jobs(port: int, metrics_port: int, tmp: Path) -> Iterator[None]:
    """The orchestrator (memory store) and two job threads taking turns on group ``dash`` every 0.5 s."""
    import grpc

    from rose_common.proto import rose_timeslice_v1_pb2 as pb
    from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
    from timeslice import certs

    tls = certs.generate(tmp / "timeslice-tls", ("127.0.0.1",))
    args = ["timeslice", "serve", "--store", "memory", "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", f"127.0.0.1:{metrics_port}", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
            "--authenticate", "none", "--job-check", "none", "--insecure"]  # fmt: skip
    creds = grpc.ssl_channel_credentials(root_certificates=tls.ca.read_bytes())
    stop = threading.Event()
    with module_process(args, tmp / "timeslice.log"), grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        stub = pb_grpc.TimeSliceOrchestratorStub(ch)
        grpc.channel_ready_future(ch).result(timeout=30)

        def turns(job: str, role: str) -> None:
            while not stop.is_set():
                with contextlib.suppress(grpc.RpcError):  # the other job's turn ran past our deadline: again
                    r = stub.Acquire(pb.AcquireRequest(group="dash", job=job, role=role), timeout=10)
                    stop.wait(0.5)
                    stub.Yield(pb.YieldRequest(group="dash", job=job, fencing_token=r.fencing_token), timeout=10)
                stop.wait(0.5)

        threads = [
            threading.Thread(target=turns, args=a, daemon=True)
            for a in (("sampler", "sampler"), ("trainer", "trainer"))
        ]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=15)


def _targets_down(prom_url: str) -> list[str]:
    """Targets not (yet) scraped successfully; all of them while Prometheus does not answer."""
    try:
        with urllib.request.urlopen(f"{prom_url}/api/v1/targets", timeout=10) as resp:
            active = json.loads(resp.read())["data"]["activeTargets"]
    except OSError as e:
        return [f"Prometheus at {prom_url}: {e}"]
    return [f"{t['labels']['job']} {t['scrapeUrl']}: {t['lastError']}" for t in active if t["health"] != "up"] or (
        [] if active else ["no targets yet"]
    )


def _panels_with_data(prom_url: str) -> tuple[dict[str, Any], list[str]]:
    data = dashboard.fetch_all(prom_url, 300.0)
    return data, dashboard.empty_panels(data)


def test_every_dashboard_panel_has_data_from_the_scenario(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    pools = sorted(set(cluster.pools.values()))
    s = act.Stage(cluster, api, print, tmp_path)
    s.quiet, s.busy = pools[-1], pools[0]
    s.capacity = {p: cluster.gpus_per_node * sum(1 for q in cluster.pools.values() if q == p) for p in pools}
    checks = act.Checks()
    vllm = VllmStandInExporter()
    predictor_port, ts_port, ts_metrics = free_port(), free_port(), free_port()
    assert cluster.extender_url is not None
    try:
        with contextlib.ExitStack() as stack:
            act._start_drivers(s, stack)
            s.forecast(0.0)
            act._start_services(s, stack)
            act._start_controller(s, stack, "on")
            targets = {
                "rose-driver": [f"127.0.0.1:{d.metrics_port}" for d in s.drivers.values()],
                "rose-extender": [cluster.extender_url.removeprefix("http://")],
                "rose-controller": [f"127.0.0.1:{s.metrics_port}"],
                "rose-predictor": [f"127.0.0.1:{predictor_port}"],
                "rose-timeslice": [f"127.0.0.1:{ts_metrics}"],
            }
            stack.enter_context(timeslice_jobs(ts_port, ts_metrics, tmp_path))
            prom_cfg = yaml.safe_dump(_prometheus_config(targets, s.quiet, vllm.port))
            prom_url = stack.enter_context(prometheus(prom_cfg, tmp_path)).url
            stack.enter_context(
                module_process(_predictor(tmp_path, prom_url, s.quiet, predictor_port), tmp_path / "predictor.log")
            )
            # every process scraped before the story starts: the counters' first increase is seen
            wait_for("Prometheus scraping every process", lambda: not _targets_down(prom_url), timeout=60)
            s.ns = new_namespace(api, "dash")
            stack.callback(delete_namespace, api, s.ns)
            uids, claims = act._grow(s, checks)
            act._start_trainer(s, stack, claims)
            act._measure_rl(s, checks)
            act._reclaim(s, checks)
            act._serving_planned(s, checks)
            act._regrow(s, checks, uids)
            # a job with roles beside it, for the role panels (the controller's gauges per role and
            # state exist for every roles job it plans, whether or not its workers find room)
            kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(_roles_job(s.ns)))
            # what Prometheus holds: every panel has a series (rates need two scrapes after the last change)
            found: dict[str, Any] = {}

            def every_panel() -> bool:
                found["data"], found["empty"] = _panels_with_data(prom_url)
                return not found["empty"]

            with contextlib.suppress(AssertionError):
                wait_for("every dashboard panel to have data", every_panel, timeout=60)
            down = _targets_down(prom_url)
            assert not down, f"Prometheus could not scrape: {down}"
            out = Path(os.environ.get("ROSE_DASHBOARD_PREVIEW_OUT") or tmp_path / "dashboard-preview.png")
            dashboard.plot(found["data"], out, "Scenario: demo act 4 + a vLLM stand-in exporter; real Prometheus.")
            assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert not found["empty"], f"panels without data: {found['empty']}"
            kubectl(cluster, "delete", "elasticrljob", ROLES_JOB, "-n", s.ns, "--wait=true", "--timeout=60s")
            act._delete(s, checks, claims)
    finally:
        vllm.close()
        for name in ("prometheus.log", "predictor.log", "timeslice.log", "controller-planner-on.log", "trainer.log"):
            with contextlib.suppress(OSError):
                print(f"--- {name} (tail)\n" + (tmp_path / name).read_text()[-2000:])
    assert checks.ok(), checks.rows
    assert shutil.which("promtool"), "promtool (Debian's prometheus package) parses the dashboard's queries"


ROLES_JOB = "grpo-roles"


def _roles_job(ns: str) -> dict[str, Any]:
    """A small ElasticRLJob with roles (trainer 1, rollouts 0-1), as examples/02_grpo_tiny_llm's."""
    pod = {"spec": {"priorityClassName": "rose-rl", "containers": [{"name": "w", "image": "rose/grpo"}]}}
    roles = {
        "trainer": {"workers": 1, "gpusPerWorker": 1, "stateBytesPerWorker": 1 << 30, "template": pod},
        "rollout": {
            "minWorkers": 0,
            "maxWorkers": 1,
            "gpusPerWorker": 1,
            "stateBytesPerWorker": 1 << 28,
            "template": pod,
        },
    }
    return elastic_rl_job(ROLES_JOB, ns, gracefulShutdownPeriod=5, minUsefulRunSeconds=60, roles=roles)
