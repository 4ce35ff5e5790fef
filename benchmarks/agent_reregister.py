"""How soon a running SDK workload is registered again after its node agent was gone for a while.

    python -m benchmarks.agent_reregister --down 1 5 12 20 30 [--json OUT.json]

For each ``--down`` value: the real node agent (in this process, as the agent tests run it) takes
a real workload (``examples/01_cartpole_reinforce.py`` through ``rose_sdk``) on a claim socket,
goes away for that many seconds (a driver restart on a loaded node), and a new agent opens the
same claim socket; reported is the time from the new socket to the workload's registration.
Until it registers, a reclaim of its claim finds no channel and is enforced (its grace unused).
I/O: unix sockets under a temporary folder, one workload subprocess per value.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def one(tmp: Path, down_s: float) -> float:
    """Seconds from the new agent's claim socket to the workload's registration (inf: 120 s)."""
    from tests.support.agent_fixtures import reaped, running_agent, start_workload, wait_registered

    tmp.mkdir(parents=True, exist_ok=True)
    with running_agent(tmp) as agent:
        sock = agent.claim_socket("claim-uid-r", "uid-r")
        wl = start_workload(tmp, "rl", socket=sock, pod_uid="uid-r", extra=["--updates", "100000"])
        wl.wait_ready()
        wait_registered(agent.engine, "uid-r")
    with reaped(wl):
        time.sleep(down_s)  # no agent: the workload's reconnects fail and back off
        with running_agent(tmp) as agent2:
            agent2.claim_socket("claim-uid-r", "uid-r")
            t0 = time.monotonic()
            while (w := agent2.engine.registry.get("uid-r")) is None or not w.connected:
                if time.monotonic() - t0 > 120:
                    return float("inf")
                time.sleep(0.02)
            return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", type=float, nargs="+", default=[1.0, 5.0, 12.0, 20.0, 30.0], help="agent outages, s")
    ap.add_argument("--json", dest="json_out", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rose-rereg-") as d:
        for i, down in enumerate(a.down):
            s = one(Path(d) / str(i), down)
            rows.append({"down_s": down, "registered_again_s": round(s, 3)})
            print(f"agent gone {down:5.1f} s -> workload registered again {s:.2f} s after the new socket", flush=True)
    if a.json_out is not None:
        a.json_out.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
