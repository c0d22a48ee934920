"""Test and benchmark aids for the collectives: a simulated cluster of network namespaces."""

from .cluster import ClusterUnavailable, SimulatedCluster, launch_across

__all__ = ["ClusterUnavailable", "SimulatedCluster", "launch_across"]
