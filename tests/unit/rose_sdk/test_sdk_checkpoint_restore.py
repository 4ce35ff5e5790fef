"""Where a checkpoint lives (a path or s3://), the newest one, and the restore a recreated worker
does on start (ROSE_RESTORE=latest), on the filesystem; the s3:// path against a real server is
tests/e2e/rose_sdk/test_checkpoint_s3.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elastic_controller import workers
from rose_common.elasticrljob import ElasticRLJob
from rose_sdk import CheckpointError, Workload, load_checkpoint, save_checkpoint, tensors_equal
from rose_sdk import checkpoint as ck
from tests.support.erj_manifests import elastic_rl_job


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    m = torch.nn.Linear(4, 2)
    return m, torch.optim.Adam(m.parameters(), lr=0.1)


def _train(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_location_keeps_s3_urls_whole_and_refuses_other_schemes() -> None:
    assert ck.checkpoint_location("s3://bucket/jobs/grpo/") == "s3://bucket/jobs/grpo"
    assert ck.checkpoint_location("s3://bucket") == "s3://bucket"
    assert ck.checkpoint_location("/ckpt/job.rose") == Path("/ckpt/job.rose")
    with pytest.raises(CheckpointError, match="names no bucket; write s3://BUCKET/PREFIX"):
        ck.checkpoint_location("s3:///prefix")
    with pytest.raises(CheckpointError, match=r"only a filesystem path .* or s3://BUCKET/PREFIX"):
        ck.checkpoint_location("gs://bucket/x")


def test_endpoint_prefers_rose_then_the_s3_specific_aws_variable() -> None:
    env = {"AWS_ENDPOINT_URL": "http://a", "AWS_ENDPOINT_URL_S3": "http://b", "ROSE_S3_ENDPOINT": "http://c"}
    assert ck.s3_endpoint(env) == "http://c"
    assert ck.s3_endpoint({k: v for k, v in env.items() if k != "ROSE_S3_ENDPOINT"}) == "http://b"
    assert ck.s3_endpoint({"AWS_ENDPOINT_URL": "http://a"}) == "http://a"
    assert ck.s3_endpoint({}) is None


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"format": 2}',
        b'{"format": 1, "object": "../etc/passwd", "sha256": "' + b"0" * 64 + b'", "nbytes": 1, "step": 1}',
    ],
)
def test_a_malformed_pointer_is_a_checkpoint_error(raw: bytes) -> None:
    with pytest.raises(CheckpointError, match="LATEST is"):
        ck._checked_pointer(raw, "s3://b/p")


def test_latest_and_restore_on_the_filesystem(tmp_path: Path) -> None:
    path = tmp_path / "job.rose"
    m, opt = _model()
    assert ck.latest_checkpoint(path) is None
    assert ck.restore_latest(path, m, opt) is None  # nothing there yet: a first start
    _train(m, opt)
    info = save_checkpoint(path, model=m, optimizer=opt, step=5)
    latest = ck.latest_checkpoint(path)
    assert latest is not None and (latest.sha256, latest.nbytes) == (info.sha256, info.nbytes)
    m2, opt2 = _model()
    restored = ck.restore_latest(path, m2, opt2)
    assert restored is not None and restored.step == 5
    assert tensors_equal(m2.state_dict(), m.state_dict()) and tensors_equal(opt2.state_dict(), opt.state_dict())


def test_restore_flag_is_latest_or_unset() -> None:
    assert ck.restore_requested({}) is False
    assert ck.restore_requested({"ROSE_RESTORE": "latest"}) is True
    with pytest.raises(CheckpointError, match="ROSE_RESTORE='yes': set it to 'latest' or leave it unset"):
        ck.restore_requested({"ROSE_RESTORE": "yes"})


def test_a_recreated_worker_restores_on_start_and_checkpoints_every_n_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.rose"
    for k, v in {"ROSE_CHECKPOINT_PATH": str(path), "ROSE_RESTORE": "latest", "ROSE_CHECKPOINT_EVERY": "3"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ROSE_AGENT_SOCKET", raising=False)
    m, opt = _model()
    first = Workload(model=m, optimizer=opt, user_state=lambda: {"seen": 1}).start()
    assert first.restored is None and first.step == 0  # no checkpoint yet: begins afresh
    for step in range(1, 8):
        _train(m, opt)
        first.safe_point(step)
        first.safe_point(step)  # a second safe point at the same step writes nothing new
    assert load_checkpoint(path).step == 6
    m2, opt2 = _model()
    second = Workload(model=m2, optimizer=opt2).start()
    assert second.restored is not None and second.step == 6 and second.restored.user_state == {"seen": 1}
    assert tensors_equal(opt2.state_dict(), load_checkpoint(path).optimizer_state)


def test_a_failed_periodic_checkpoint_does_not_stop_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ROSE_CHECKPOINT_EVERY", "1")
    monkeypatch.delenv("ROSE_RESTORE", raising=False)
    wl = Workload(checkpoint_path=blocker / "job.rose").start()  # its parent is a file: the save fails
    wl.safe_point(1)
    assert wl.step == 1 and wl.last_checkpoint is None
    assert "periodic durable checkpoint failed; training continues" in caplog.text


def test_checkpoint_every_must_be_a_positive_whole_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_CHECKPOINT_EVERY", "0")
    with pytest.raises(ValueError, match="ROSE_CHECKPOINT_EVERY='0': set it to a positive whole number"):
        Workload()


def test_workload_keeps_an_s3_url_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROSE_RESTORE", raising=False)
    assert Workload(checkpoint_path="s3://bucket/jobs/grpo").checkpoint_path == "s3://bucket/jobs/grpo"


def test_workers_with_a_checkpoint_path_are_told_to_restore_from_it() -> None:
    def env(**spec: object) -> dict[str, str]:
        fields = {"minGPUs": 1, "maxGPUs": 2, "gpusPerWorker": 1, **spec}
        template = {"spec": {"containers": [{"name": "t", "image": "i"}]}}
        job = ElasticRLJob.model_validate(elastic_rl_job("grpo", "rl", {"uid": "u1"}, **fields, template=template))
        (c,) = workers.worker_pod(job, 0)["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in c["env"]}

    with_path = env(checkpointPath="s3://b/grpo")
    assert with_path["ROSE_CHECKPOINT_PATH"] == "s3://b/grpo" and with_path["ROSE_RESTORE"] == "latest"
    assert "ROSE_RESTORE" not in env()
