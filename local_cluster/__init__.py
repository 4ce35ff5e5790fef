"""A real local Kubernetes (etcd, kube-apiserver, kube-controller-manager, two kube-schedulers,
KWOK) as processes on loopback, for ROSE's end-to-end tests, benchmarks and demo.

    from local_cluster import LocalCluster, ClusterConfig
    handle = LocalCluster(ClusterConfig(nodes=4, gpus_per_node=8, workdir=tmp)).up()
    ... handle.kubeconfig, handle.api_client(), handle.node_names, handle.extender_url ...
    LocalCluster(ClusterConfig(workdir=tmp)).down()

``ClusterConfig.extender_url=None`` runs the ``rose-scheduler`` profile without the extender;
``seed_slices=False`` leaves ResourceSlice publication to the DRA driver processes.
This is a development harness, not a product component: nothing in production imports it.
"""

from local_cluster.binaries import Binaries, BinariesError, ensure
from local_cluster.cluster import (
    DEFAULT_EXTENDER_PORT,
    ClusterConfig,
    ClusterError,
    ClusterHandle,
    LocalCluster,
    apply_file,
    default_workdir,
    free_port,
    kwok_node,
    module_process,
    port_in_use,
    reserved_port,
    stop_process,
)

__all__ = [
    "DEFAULT_EXTENDER_PORT",
    "Binaries",
    "BinariesError",
    "ClusterConfig",
    "ClusterError",
    "ClusterHandle",
    "LocalCluster",
    "apply_file",
    "default_workdir",
    "ensure",
    "free_port",
    "kwok_node",
    "module_process",
    "port_in_use",
    "reserved_port",
    "stop_process",
]
