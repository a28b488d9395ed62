"""A fake GPU device plugin for kind: the kubelet's own device plugin API, fake devices.

It registers with the kubelet (`deviceplugin/v1beta1`, gRPC on the kubelet's socket in
/var/lib/kubelet/device-plugins/), advertises N devices of `nvidia.com/gpu`, N read from
its node's label `modelpool.dev/fake-gpus`, reports them healthy through `ListAndWatch`,
and answers `Allocate` as the NVIDIA plugin does in the part that matters here: the
container gets `NVIDIA_VISIBLE_DEVICES` with its device ids, plus `MODELPOOL_GPU_LOCK_DIR`
and a mount of the node's per-device lock directory, where the fake model server takes an
exclusive lock per device (so two loaded servers on one device fail loudly).

Shared mode, as the NVIDIA plugin's time-slicing `replicas` shares a GPU: a node labelled
`modelpool.dev/fake-gpu-shares=S` and `modelpool.dev/fake-gpu-memory-mib=M` advertises each
device S times (ids `<device>::<n>`), and a container allocated any of them also gets
`MODELPOOL_GPU_MEMORY` (M MiB in bytes): the fake model servers then charge their
footprints to the device's memory ledger instead of locking it, and a load that would pass
the memory fails loudly (e2e/fake_model/gpu_ledger.py). When the
kubelet restarts it removes the plugins' sockets; the plugin sees its socket go and
registers again.

    python -m e2e.device_plugin        # in the DaemonSet of e2e/kind/fake-gpu-plugin.yaml

The pure part is `devices`; `server` is the gRPC shell. The stubs (`api_pb2`,
`api_pb2_grpc`) are generated from the kubelet module's api.proto when the image is built
(e2e/kind/build-and-load.sh) and are not part of the repository.
"""
