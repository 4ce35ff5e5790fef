"""The node agent: gRPC servers on unix sockets (rose.agent.v1).

``WorkloadAgent`` is for workload pods (the rose_sdk), ``NodeControl`` for the controller and the
timeslice orchestrator. Both front a ``dra_driver.suspend.NodeSuspendEngine``.
"""

from dra_driver.agent.server import AgentServer, NodeControlServicer, WorkloadAgentServicer

__all__ = ["AgentServer", "NodeControlServicer", "WorkloadAgentServicer"]
