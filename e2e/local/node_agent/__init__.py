"""The local node agent: plays the kubelet for one Node of the testbed.

No kubelet and no container runtime run here, so this agent registers a Node (with
`nvidia.com/gpu: N` in capacity and allocatable, as a device plugin would advertise),
keeps its Lease in `kube-node-lease` and its Ready condition fresh, and runs every pod
bound to it as local processes, writing pod status back through pods/status.

Run: `python -m e2e.local.node_agent --kubeconfig FILE --node-name NAME --gpus N
--state-dir DIR [--pod-network 127.X.0.0/16] [--unschedulable]` (FILE an admin
kubeconfig). SIGTERM stops every pod gracefully and exits; the pod objects stay, and a
restarted agent runs them again (same address, restart counts kept).

What it honours: command/args with `$(VAR)` expansion; env (value, fieldRef,
resourceFieldRef, configMapKeyRef, secretKeyRef, envFrom); ConfigMap, Secret, emptyDir,
hostPath, downward-API, projected and PersistentVolumeClaim volumes (a claim resolves to
its bound volume's hostPath/local path, else `DIR/claims/<ns>_<claim>`); ConfigMap and
Secret volumes follow their objects as soon as a watch sees the change, written
atomically (`..data` swap);
init containers (in order, to completion); httpGet and tcpSocket readiness, liveness
and startup probes (exec and grpc probes always fail: they cannot run here);
restartPolicy with a 1 s doubling backoff capped at 20 s; deletion (SIGTERM to the
process group, SIGKILL after the grace period, GPUs released and the pod object removed
with gracePeriodSeconds=0 only once every process has exited); pods that vanish from
the API are stopped (grace at most 5 s). `terminationMessagePolicy:
FallbackToLogsOnError` puts the log's tail in `terminated.message`. Ignored: security
contexts (processes run as the agent's user), resource limits other than GPUs,
hostNetwork, workingDir. Events (source `kubelet`): Started, Killing, BackOff,
Unhealthy (a liveness/startup failure), Failed (unknown image), FailedMount; never on a
timer, so an idle cluster stays quiet.

Images (docs/contracts.md section 3; registry, tag and digest ignored), each run with
the agent's own interpreter (`sys.executable`):

    modelpool/fake-model       python -m e2e.fake_model
    ggml-org/llama.cpp         python -m e2e.fake_model --mode llamacpp
    modelpool/llama-server     python -m e2e.llama.serve  (the real llama-server)
    vllm/vllm-openai           python -m e2e.fake_model --mode vllm
    modelpool/modelpool        python -m reconciler  (the product's image; with the
                               command modelpool-router: python -m sidecar)
    modelpool/router           python -m sidecar
    modelpool/reconciler       python -m reconciler
    modelpool/testbed-client   python -m e2e.local.node_agent.client  (test-only)

`modelpool/testbed-client` takes `list RESOURCE` or `get RESOURCE NAME` (e.g. `list
pods`, `get secrets x`) in its kubeconfig's namespace with its own token, prints `OK
<n>` / `OK <name>` and exits 0, or prints `FORBIDDEN` / `NOTFOUND` / `ERROR ...` and
exits 1; the testbed uses it to show that RBAC applies to pod processes.

An unknown image fails the pod: phase Failed, reason `UnknownImage`, and the
container waiting with reason `UnknownImage` and a message naming the image.

Files under the state directory DIR:

    DIR/pods/<namespace>_<name>_<uid>/<container>.log   stdout+stderr of the container,
                                                        appended across restarts
    DIR/pods/<namespace>_<name>_<uid>/volumes/<volume>/ ConfigMap, Secret, emptyDir,
                                                        downward-API, projected volumes
    DIR/pods/<namespace>_<name>_<uid>/kubeconfig        the pod's ServiceAccount token
    DIR/gpus/                                           MODELPOOL_GPU_LOCK_DIR

Every process gets `MODELPOOL_BIND_HOST=<pod IP>` (127.0.x.y, unique per pod, never
127.0.0.1), `HOSTNAME=<pod name>`, a GPU container `NVIDIA_VISIBLE_DEVICES` and
`MODELPOOL_GPU_LOCK_DIR`, and an automounted token `KUBECONFIG`. Mount paths in
command, args and env are rewritten to the volume directories. Nothing of the agent's
own environment leaks in but PATH, LANG and PYTHONPATH; HOME is the pod's directory.

Module map: pure logic in images, podspec, volumes, allocation, probes, restarts,
status, node, settings; I/O in kube (the only kr8s import), probe_http (the only HTTP
client), processes, files, pod_files (volumes, tokens, kubeconfig), objects (the
ConfigMap/Secret watch cache); worker (one pod)
and agent (the node) are the async shells; client is the testbed-client program.
"""
