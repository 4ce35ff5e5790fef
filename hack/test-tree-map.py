#!/usr/bin/env python3
"""Reorganise tests/ into the per-package tree (issue 26 §3). A maintenance script, not shipped.

    python hack/test-tree-map.py support [--apply]   # helpers and data modules -> tests/support/
    python hack/test-tree-map.py tree [--apply]      # tests/<tier>/test_x.py -> tests/<tier>/<package>/
    python hack/test-tree-map.py rename [--apply]    # issue-named files -> named after what they test
    python hack/test-tree-map.py refs --apply        # after a merge: mend references to moved files

Without --apply it prints the plan (old -> new, and for ``tree`` why). With --apply it moves with
``git mv`` and rewrites every reference in the tracked text files: paths (``tests/x.py``), dotted
names (``tests.x``), bare imports of a helper or test module (``from x import``), ``"tests" / "x.py"``
path joins, and ``Path(__file__)`` depth in the moved files. Re-run it after a merge: new flat files
(a helper at ``tests/*.py``, a test straight in a tier folder) are placed by the same rules; a test it
cannot place is printed as UNPLACED and left where it is (add it to OVERRIDES, or ``git mv`` it by
hand and run ``refs --apply``). References are rewritten in tracked files only (``git add`` new ones
first). It commits nothing; afterwards ``ruff check --fix --select I,F401 tests && ruff format tests``
puts the rewritten imports in order.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TIERS = ("unit", "contract", "e2e", "device")
SUPPORT = "tests/support"

# Modules under a tier that hold no test (data, a child process): they go to tests/support/ too.
DATA_MODULES = {
    "tests/e2e/test_elastic_cel_cases.py": f"{SUPPORT}/elastic_cel_cases.py",
    "tests/device/train_child.py": f"{SUPPORT}/train_child.py",
}
DATA_DIRS = {"tests/unit/extender_golden": f"{SUPPORT}/extender_golden"}

# The folders of a tier: the product packages (two sub-packages of dra_driver are packages of
# their own here: the node agent and the suspend engine), and ``repo`` for the repository's own
# rules and artefacts (lint scripts in hack/, the image, the install, the manifests' policies).
COMPONENTS = (
    "agent",
    "suspend",
    "dra_driver",
    "scheduler_extender",
    "predictor",
    "elastic_controller",
    "timeslice",
    "rose_sdk",
    "rose_cli",
    "rose_sim",
    "local_cluster",
    "benchmarks",
    "rose_common",
)
SHARED = ("rose_common", "local_cluster")  # used by nearly every test: a weak signal

# A file name's prefix says what it is meant to test (longest prefix wins) ...
PREFIX = {
    "agent": "agent",
    "bench": "benchmarks",
    "cli": "rose_cli",
    "cluster": "local_cluster",
    "common": "rose_common",
    "coop_spill": "suspend",
    "dashboard": "rose_cli",
    "demo": "rose_cli",
    "driver": "dra_driver",
    "elastic": "elastic_controller",
    "elasticrljob": "elastic_controller",
    "extender": "scheduler_extender",
    "predictor": "predictor",
    "timeslice": "timeslice",
    "sdk": "rose_sdk",
    "rollout": "rose_sdk",
    "rose_sim": "rose_sim",
    "simulate": "rose_sim",
    "soak": "benchmarks",
    "informer": "rose_common",
    "kube_kernel": "rose_common",
    "kwatch": "rose_common",
    "workqueue": "rose_common",
    "httpserver": "rose_common",
    "http_kernel": "rose_common",
    "realnode": "local_cluster",
    "real_node": "local_cluster",
    "checkpoint_s3": "rose_sdk",
    "ray": "rose_sdk",
    "transformers": "rose_sdk",
    "trl": "rose_sdk",
    "component": "rose_cli",
    "controller_scale": "benchmarks",
    "reclaim": "dra_driver",
    "spill": "suspend",
}
# ... unless what it imports says otherwise, clearly (a test_agent_* that drives the suspend
# engine): the most-imported component wins when the prefix's package is not imported at all,
# or when it is imported at least RATIO times as often and at least MIN_IMPORTS times.
RATIO, MIN_IMPORTS = 2, 5

# Decided by reading the test, where neither rule can (the reason is printed with the plan).
OVERRIDES = {
    "test_function_length.py": ("repo", "hack/check-function-length.py"),
    "test_import_layers.py": ("repo", ".importlinter contracts"),
    "test_device_check_budget.py": ("repo", "hack/device-check.sh"),
    "test_device_tier_collects.py": ("repo", "the device tier's own dependencies"),
    "test_driver_protos_current.py": ("rose_common", "rose_common/proto stubs vs hack/gen-protos.sh"),
    "test_driver_wire_golden.py": ("rose_common", "golden bytes of rose_common/proto's driver RPCs"),
    "test_agent_proto_golden.py": ("rose_common", "golden bytes of rose_common/proto's rose.agent.v1"),
    "test_image.py": ("repo", "the image (hack/build-image.sh)"),
    "test_install.py": ("repo", "the README's kustomize install"),
    "test_security_policy.py": ("repo", "RBAC and admission manifests (docs/security.md)"),
    "test_rollout_examples.py": ("repo", "examples/kuberay-raycluster.yaml"),
    "test_names.py": ("rose_common", "the shared names (rose_common) for driver and engine"),
    "test_node_security.py": ("agent", "the node agent's identity checks and the DaemonSet"),
    "test_forecast_risk.py": ("scheduler_extender", "the extender's and planner's risk readers; extender first"),
    "test_forecast_risk_predictor.py": ("predictor", "the real predictor process serving risks"),
    "test_elastic_replay.py": ("benchmarks", "the planner replay benchmark"),
    "test_sdk_fresh_venv.py": ("rose_sdk", "the rose-sdk distribution in a fresh venv"),
    "test_cluster_crd.py": ("elastic_controller", "the ElasticRLJob CRD"),
    "test_cluster_dra.py": ("local_cluster", "DRA on the local cluster's binaries"),
    "test_agent_api.py": ("agent", "rose.agent.v1 server with an SDK workload"),
    "test_agent_fencing.py": ("agent", "rose.agent.v1 NodeControl fencing"),
    "test_agent_restart.py": ("agent", "a node-agent restart"),
    "test_agent_training_unharmed.py": ("agent", "training through the node agent"),
    "test_elastic_world_training.py": ("agent", "world changes delivered by the node agent"),
    "test_coop_spill.py": ("suspend", "the engine's cooperative spill"),
    "test_example02_cluster_e2e.py": ("elastic_controller", "example 02 as an ElasticRLJob"),
    "test_lost_worker_restore_e2e.py": ("elastic_controller", "the controller recreating a lost worker"),
    "test_checkpoint_s3_verify.py": ("dra_driver", "the driver's fallback verifying an s3:// checkpoint"),
    "test_agent_e2e.py": ("agent", "the cooperative suspend path through the node agent"),
    "test_gpu_suspend.py": ("benchmarks", "python -m benchmarks.gpu_suspend"),
    "test_dashboard_metrics.py": ("rose_cli", "rose_cli.dashboard_spec"),
    "test_sdk_cdi_env.py": ("rose_sdk", "the SDK reading the driver's CDI environment"),
    "test_sdk_staging.py": ("rose_sdk", "rose_sdk.staging"),
    "test_driver_spill_e2e.py": ("dra_driver", "the real rose driver with a spill tier"),
    "test_demo_elastic.py": ("rose_cli", "rose_cli.demo_elastic (demo act 4)"),
    "test_agent_reports_socket.py": ("agent", "the real agent's claim socket"),
    "test_http_kernel_load.py": ("rose_common", "rose_common.httpserver under load"),
}

# Files named after an issue rather than what they test (step 3), per tier-relative basename.
# The tier's folder decides the test's package; these names said something else (a misnamed prefix,
# the tier, or the issue that produced them: "Issue 11 (node part)").
RENAMES: dict[str, str] = {
    "test_agent_engine.py": "test_suspend_engine.py",
    "test_agent_cuda_checkpoint.py": "test_suspend_cuda_checkpoint.py",
    "test_agent_shared_claim.py": "test_suspend_shared_claim.py",
    "test_driver_checkpoint_verify.py": "test_suspend_checkpoint_verify.py",
    "test_driver_pids.py": "test_suspend_pids.py",
    "test_driver_spill.py": "test_suspend_spill.py",
    "test_node_security.py": "test_agent_identity_checks.py",
    "test_cluster_unit.py": "test_cluster_parts.py",
    "test_realnode_unit.py": "test_realnode_parts.py",
}
# Every move applied so far (old<TAB>new): ``refs`` rewrites references to them again, so that a
# file merged in later that still cites an old path or module name is mended.
RECORD = REPO / "hack" / "test-tree-moves.tsv"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def imported(path: Path) -> Counter[str]:
    """How often the module imports each component (``python -m <component>`` counts too)."""
    tree = ast.parse(path.read_text())
    seen: Counter[str] = Counter()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names]
    names += re.findall(r'"-m",\s*"([A-Za-z_.]+)"', path.read_text())
    for name in names:
        parts = name.split(".")
        if parts[0] == "dra_driver" and len(parts) > 1 and parts[1] in ("agent", "suspend"):
            seen[parts[1]] += 1
        elif parts[0] in COMPONENTS:
            seen[parts[0]] += 1
    return seen


def by_prefix(stem: str) -> str | None:
    name = stem.removeprefix("test_")
    hits = [p for p in PREFIX if name == p or name.startswith(p + "_")]
    return PREFIX[max(hits, key=len)] if hits else None


def place(path: Path) -> tuple[str | None, str]:
    """The package folder of one test module, and why."""
    if path.name in OVERRIDES:
        pkg, why = OVERRIDES[path.name]
        return pkg, f"override: {why}"
    seen = imported(path)
    strong = Counter({k: v for k, v in seen.items() if k not in SHARED})
    top, n = strong.most_common(1)[0] if strong else (None, 0)
    pre = by_prefix(path.stem)
    counts = ", ".join(f"{k} {v}" for k, v in seen.most_common())
    if pre is None:
        top = top or (seen.most_common(1)[0][0] if seen else None)  # only shared packages: the most used
        return top, f"imports: {counts}" if top else "no prefix, imports nothing of ours"
    if top and top != pre and (seen[pre] == 0 or (n >= RATIO * seen[pre] and n >= MIN_IMPORTS)):
        return top, f"prefix says {pre}, imports say {top} ({counts})"
    return pre, f"prefix ({counts})" if counts else "prefix"


# --- the plans ----------------------------------------------------------------------------------


def plan_support() -> list[tuple[str, str, str]]:
    moves = [
        (f"tests/{p.name}", f"{SUPPORT}/{p.name}", "helper")
        for p in sorted(TESTS.glob("*.py"))
        if p.name != "conftest.py"
    ]
    moves += [(o, n, "data") for o, n in {**DATA_MODULES, **DATA_DIRS}.items() if (REPO / o).exists()]
    return moves


def plan_tree() -> tuple[list[tuple[str, str, str]], list[str]]:
    moves, unplaced = [], []
    for tier in TIERS:
        for p in sorted((TESTS / tier).glob("test_*.py")):
            pkg, why = place(p)
            if pkg is None:
                unplaced.append(f"tests/{tier}/{p.name} ({why})")
            else:
                moves.append((f"tests/{tier}/{p.name}", f"tests/{tier}/{pkg}/{p.name}", why))
    return moves, unplaced


def plan_rename() -> list[tuple[str, str, str]]:
    moves = []
    for old, new in RENAMES.items():
        hits = list(TESTS.glob(f"*/**/{old}"))
        moves += [(str(h.relative_to(REPO)), str(h.with_name(new).relative_to(REPO)), "rename") for h in hits]
    return moves


# --- rewriting references -----------------------------------------------------------------------


def _dotted(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def _depth_fix(text: str, delta: int) -> str:
    """``Path(__file__)`` relative to the repository, for a file moved ``delta`` folders deeper."""
    if delta == 0:
        return text
    anchor = r"(Path\(__file__\)(?:\.resolve\(\))?)"
    text = re.sub(anchor + r"\.parents\[(\d)\]", lambda m: f"{m[1]}.parents[{int(m[2]) + delta}]", text)
    text = re.sub(anchor + r"\.parent\.parent\b", lambda m: f"{m[1]}.parents[{1 + delta}]", text)
    # HERE = Path(__file__).resolve().parent; HERE.parent (the repository from tests/)
    if re.search(r"^HERE = Path\(__file__\)\.resolve\(\)\.parent$", text, re.M):
        text = re.sub(r"\bHERE\.parent\b", f"HERE.parents[{delta}]", text)
    return text


def rewrite(moves: list[tuple[str, str, str]], depth_moves: list[tuple[str, str, str]]) -> list[str]:
    """Rewrite references to the moved paths in every tracked text file (idempotent: a new path never
    contains its old one); ``Path(__file__)`` depth only in the files of ``depth_moves``, moved just
    now. Returns the files changed."""
    subs: list[tuple[re.Pattern[str], str]] = []
    for old, new, _ in moves:
        o, n = old.removesuffix(".py"), new.removesuffix(".py")
        subs.append((re.compile(rf"(?<![\w/.]){re.escape(o)}(?![\w/-])"), n))  # tests/x(.py)
        subs.append((re.compile(rf"(?<![\w.]){re.escape(_dotted(old))}(?!\w)"), _dotted(new)))  # tests.x
        ostem, nstem = Path(old).stem, Path(new).stem
        if old.endswith(".py"):
            # bare imports: tests/ and a tier folder were on sys.path; tests/support is a package
            subs.append((re.compile(rf"^(\s*)from {ostem} import\b", re.M), rf"\1from {_dotted(new)} import"))
            pkg, _, mod = _dotted(new).rpartition(".")
            subs.append((re.compile(rf"^(\s*)import {ostem}$", re.M), rf"\1from {pkg} import {mod}"))
            opkg = _dotted(old).rpartition(".")[0]  # from tests import x
            pat = re.compile(rf"^(\s*)from {re.escape(opkg)} import {ostem}\b", re.M)
            subs.append((pat, rf"\1from {pkg} import {mod}"))
            short = re.escape(_dotted(old).removeprefix("tests."))  # from unit.test_x import (tests/ on sys.path)
            subs.append((re.compile(rf"^(\s*)from {short} import\b", re.M), rf"\1from {_dotted(new)} import"))
            # path joins: "tests" / "x.py" and "tests" / "unit" / "x"
            oj = " / ".join(f'"{s}"' for s in old.split("/"))
            nj = " / ".join(f'"{s}"' for s in new.split("/"))
            subs.append((re.compile(re.escape(oj)), nj))
        else:
            oj = " / ".join(f'"{s}"' for s in old.split("/"))
            subs.append((re.compile(re.escape(oj)), " / ".join(f'"{s}"' for s in new.split("/"))))
        if ostem != nstem:  # a renamed module: its bare name in prose and test ids
            subs.append((re.compile(rf"(?<![\w.]){ostem}(?!\w)"), nstem))
    moved_to = {new: len(Path(new).parts) - len(Path(old).parts) for old, new, _ in depth_moves}
    changed = []
    for rel in git("ls-files").splitlines():
        path = REPO / rel
        skip = rel in ("hack/test-tree-map.py", "hack/test-tree-moves.tsv") or path.suffix in (".json", ".png", ".pb")
        if skip or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new_text = text
        for pat, rep in subs:
            new_text = pat.sub(rep, new_text)
        if rel.endswith(".py") and rel in moved_to:
            new_text = _depth_fix(new_text, moved_to[rel])
        if new_text != text:
            path.write_text(new_text)
            changed.append(rel)
    return changed


def recorded() -> list[tuple[str, str, str]]:
    if not RECORD.exists():
        return []
    return [(o, n, "recorded") for o, n in (line.split("\t") for line in RECORD.read_text().splitlines() if line)]


def apply(moves: list[tuple[str, str, str]]) -> None:
    for old, new, _ in moves:
        (REPO / new).parent.mkdir(parents=True, exist_ok=True)
        git("add", "--", old)  # a file not yet committed can be moved too
        git("mv", old, new)
    with RECORD.open("a") as f:
        f.writelines(f"{old}\t{new}\n" for old, new, _ in moves)
    init = REPO / SUPPORT / "__init__.py"
    if any(new.startswith(SUPPORT + "/") for _, new, _ in moves) and not init.exists():
        init.write_text('"""Shared test helpers: fixtures, stand-ins, data and the processes tests start."""\n')
        git("add", str(init.relative_to(REPO)))
    for rel in rewrite(recorded(), depth_moves=moves):
        print(f"  rewrote {rel}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("support", "tree", "rename", "refs"))
    ap.add_argument("--apply", action="store_true", help="git mv and rewrite references (default: print the plan)")
    a = ap.parse_args()
    unplaced: list[str] = []
    if a.step == "support":
        moves = plan_support()
    elif a.step == "tree":
        moves, unplaced = plan_tree()
    elif a.step == "rename":
        moves = plan_rename()
    else:  # refs: no move, references to every recorded move mended (idempotent)
        changed = rewrite(recorded(), depth_moves=[]) if a.apply else []
        print("\n".join(f"  rewrote {c}" for c in changed) or "nothing to rewrite (or no --apply)")
        return 0
    for old, new, why in moves:
        print(f"{old} -> {new}    [{why}]")
    for u in unplaced:
        print(f"UNPLACED {u}")
    if a.apply and moves:
        apply(moves)
    print(f"{len(moves)} moves, {len(unplaced)} unplaced", file=sys.stderr)
    return 1 if unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
