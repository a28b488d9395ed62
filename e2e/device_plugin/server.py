"""The fake GPU plugin's gRPC shell: it serves the DevicePlugin service on its socket,
registers with the kubelet, and registers again whenever its socket disappears (the
kubelet removes the plugins' sockets when it restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import api_pb2  # generated from the kubelet's api.proto when the image is built
import api_pb2_grpc
import grpc

from e2e.device_plugin import devices

log = logging.getLogger("fake-gpu-plugin")

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
SOCKET_NAME = "modelpool-fake-gpu.sock"
API_VERSION = "v1beta1"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SOCKET_POLL_SECONDS = 0.5


class FakeGpus(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, ids: list[str], how: devices.Sharing = devices.EXCLUSIVE) -> None:
        self.ids = ids
        self.how = how
        self.stopping = asyncio.Event()

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        log.info("kubelet opened ListAndWatch: %d healthy devices", len(self.ids))
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=i, health=devices.HEALTHY) for i in self.ids])
        await self.stopping.wait()  # the device set never changes: hold the stream open

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=devices.preferred(
                list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size))
            for r in request.container_requests
        ])

    async def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for r in request.container_requests:
            try:
                plan = devices.allocation(list(r.devices_ids), self.ids, self.how)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            log.info("allocated devices %s", ",".join(r.devices_ids))
            responses.append(api_pb2.ContainerAllocateResponse(
                envs=dict(plan.envs),
                mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                                      read_only=m.read_only) for m in plan.mounts],
            ))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


def node_labels(node: str) -> dict[str, str]:
    """The labels of `node`, read with the pod's service account."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    request = urllib.request.Request(f"https://{host}:{port}/api/v1/nodes/{node}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        body = json.load(response)
    return dict(body["metadata"].get("labels") or {})


def make_locks(ids: list[str], lock_dir: Path) -> None:
    """One lock file per device, and its memory ledger (e2e/fake_model/gpu_ledger.py: a
    lock and a directory of charges), open to the model servers' (non-root) users."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock_dir.chmod(0o777)
    for i in ids:
        for name in (f"gpu{i}.lock", f"gpu{i}.ledger"):
            path = lock_dir / name
            path.touch(exist_ok=True)
            path.chmod(0o666)
        charges = lock_dir / f"gpu{i}.charges"
        charges.mkdir(exist_ok=True)
        charges.chmod(0o777)


async def register(kubelet_socket: Path) -> None:
    """Register with the kubelet, trying again until it answers."""
    while True:
        try:
            async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
                await api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=SOCKET_NAME, resource_name=devices.RESOURCE,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ), timeout=10)
            return
        except grpc.aio.AioRpcError as e:
            log.warning("registering with the kubelet failed (%s); again in 1s", e.code())
            await asyncio.sleep(1)


async def serve(ids: list[str], plugin_dir: Path, stop: asyncio.Event,
                how: devices.Sharing = devices.EXCLUSIVE) -> None:
    own = plugin_dir / SOCKET_NAME
    while not stop.is_set():
        own.unlink(missing_ok=True)
        plugin = FakeGpus(ids, how)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{own}")
        await server.start()
        await register(plugin_dir / "kubelet.sock")
        log.info("registered %s with the kubelet: %d devices", devices.RESOURCE, len(ids))
        while own.exists() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SOCKET_POLL_SECONDS)
        if not stop.is_set():
            log.info("the kubelet removed %s (it restarted): registering again", own)
        plugin.stopping.set()
        await server.stop(grace=1)
    own.unlink(missing_ok=True)

