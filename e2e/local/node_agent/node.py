"""The Node object and Lease this agent keeps, as plain bodies (pure)."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from e2e.local.node_agent.status import rfc3339

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeShape:
    name: str
    gpus: int
    cpu: str
    memory: str
    pods: int
    address: str = "127.0.0.1"
    version: str = "v0.0.0-modelpool-local"
    # Registered cordoned: only pods that name the node in spec.nodeName land on it.
    unschedulable: bool = False


def node_body(shape: NodeShape) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": shape.name,
            "labels": {
                "kubernetes.io/hostname": shape.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64" if platform.machine() == "x86_64" else "arm64",
                "modelpool.dev/local-node": "true",
            },
        },
        "spec": {"unschedulable": True} if shape.unschedulable else {},
    }


def node_status(shape: NodeShape, now: float, ready_since: float) -> dict[str, Any]:
    """Capacity as a device plugin would advertise it, and fresh heartbeats."""
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        "ephemeral-storage": "100Gi",
        GPU_RESOURCE: str(shape.gpus),
    }

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
            condition("Ready", "True", "KubeletReady", "the node agent is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": shape.address},
            {"type": "Hostname", "address": shape.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": platform.release(),
            "osImage": "modelpool local node",
            "containerRuntimeVersion": "local://processes",
            "kubeletVersion": shape.version,
            "kubeProxyVersion": shape.version,
            "operatingSystem": "linux",
            "architecture": "amd64" if platform.machine() == "x86_64" else "arm64",
        },
    }


def lease_body(node: str, node_uid: str, duration: int, now_micro: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration,
            "renewTime": now_micro,
        },
    }


def micro_time(moment: float) -> str:
    """A Lease's MicroTime."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(
    pod: Mapping[str, Any], node: str, kind: str, reason: str, message: str, now: float
) -> dict[str, Any]:
    """A core/v1 Event about a pod, from this node's kubelet stand-in."""
    meta = pod["metadata"]
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": kind,
        "reason": reason,
        "message": message[:1000],
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
