"""The collective hand-over: pure planning, and the two-phase protocol against an in-memory pod
API whose nodes act like the DRA driver's suspend-request path (one node can be made to fail).
The real drivers on a local cluster are in tests/e2e/timeslice/test_timeslice_handover_e2e.py."""

from __future__ import annotations

import pytest

from rose_common import names
from tests.support.handover_fakes import GROUP, HandoverCluster, group_pods
from timeslice.handover import RUNNING, SUSPENDED, HandoverError, KubeHandover, plan, progress


def test_plan_suspends_out_then_restores_in_and_rolls_back_in_reverse() -> None:
    p = plan(group_pods(), GROUP, 7, "ml/a", "ml/b", "t")
    assert [x.key() for x in p.suspend.patches] == ["ml/a-0", "ml/a-1"] and p.suspend.want == SUSPENDED
    assert [x.key() for x in p.restore.patches] == ["ml/b-0", "ml/b-1"] and p.restore.want == RUNNING
    assert all(x.annotations[names.ANNOTATION_FENCING_TOKEN] == "grp:7" for x in p.suspend.patches + p.restore.patches)
    assert all(x.annotations[names.ANNOTATION_SUSPEND_REQUEST] for x in p.suspend.patches)
    assert all(x.annotations[names.ANNOTATION_SUSPEND_REQUEST] is None for x in p.restore.patches)
    back_in, back_out = p.rollback
    assert back_in.want == SUSPENDED and [x.key() for x in back_in.patches] == ["ml/b-0", "ml/b-1"]
    assert back_out.want == RUNNING and [x.key() for x in back_out.patches] == ["ml/a-0", "ml/a-1"]
    lazy = plan(group_pods(), GROUP, 1, None, "ml/b", "t")  # nothing resident: nothing to suspend
    assert lazy.suspend.patches == ()


@pytest.mark.parametrize(("job", "frag"), [("b", "namespace/name"), ("ml/zz", "no worker pods of ml/zz")])
def test_plan_refuses_what_it_cannot_switch_clearly(job: str, frag: str) -> None:
    with pytest.raises(HandoverError, match=frag):
        plan(group_pods(), GROUP, 1, None, job, "t")


def test_progress_names_the_pods_and_nodes_not_there_yet() -> None:
    p = plan(group_pods(), GROUP, 1, "ml/a", "ml/b", "t")
    pods = {f"ml/{w['metadata']['name']}": w for w in group_pods()}
    assert progress(p.suspend, pods) == ["ml/a-0@n1", "ml/a-1@n2"]
    assert progress(p.restore, pods) == ["ml/b-0@n1", "ml/b-1@n2"]
    del pods["ml/b-1"]
    assert progress(p.rollback[0], pods) == ["ml/b-1@?"]


def _cluster(fail: dict[str, str] | None = None) -> HandoverCluster:
    return HandoverCluster({f"ml/{w['metadata']['name']}": w for w in group_pods()}, fail or {})


def test_switch_moves_every_node_in_two_phases() -> None:
    c = _cluster()
    res = KubeHandover(c, clock=c.clock).switch(GROUP, 3, "ml/a", "ml/b", deadline=c.now + 30)
    assert res.ok and not res.error, res.error
    assert [c.state(k) for k in ("ml/a-0", "ml/a-1", "ml/b-0", "ml/b-1")] == [SUSPENDED, SUSPENDED, RUNNING, RUNNING]
    assert [p.key() for p in c.patches] == ["ml/a-0", "ml/a-1", "ml/b-0", "ml/b-1"]  # all suspends before restores


def test_a_node_that_fails_to_suspend_rolls_the_other_back() -> None:
    c = _cluster(fail={"n2": SUSPENDED})
    res = KubeHandover(c, clock=c.clock, rollback_timeout_s=5).switch(GROUP, 3, "ml/a", "ml/b", deadline=c.now + 30)
    assert not res.ok and res.failed_pods == ("ml/a-1@n2",)
    assert "missed its deadline on ml/a-1@n2" in res.error and "rolled back" in res.error
    assert c.state("ml/a-0") == RUNNING  # n1 resumed the job it had suspended: all or nothing
    assert names.ANNOTATION_SUSPEND_REQUEST not in c.pods["ml/a-0"]["metadata"]["annotations"]
    assert c.state("ml/b-0") == SUSPENDED and c.state("ml/b-1") == SUSPENDED  # b never ran
    assert res.rolled_back and "did not roll back" not in res.error


def test_a_node_that_fails_to_restore_rolls_back_both_jobs_everywhere() -> None:
    c = _cluster(fail={"n2": RUNNING})  # n2 suspends but cannot resume anything
    res = KubeHandover(c, clock=c.clock, rollback_timeout_s=5).switch(GROUP, 4, "ml/a", "ml/b", deadline=c.now + 30)
    assert not res.ok and res.failed_pods == ("ml/b-1@n2",)
    assert c.state("ml/b-0") == SUSPENDED  # the restored rank of b is suspended again
    assert c.state("ml/a-0") == RUNNING  # and a resumed where it could be
    assert not res.rolled_back and "did not roll back in 5s: ml/a-1@n2" in res.error  # n2 stays broken: said so
