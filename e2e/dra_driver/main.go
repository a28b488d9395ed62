// Command fake-gpu-dra is a Dynamic Resource Allocation kubelet plugin for the fake GPUs of
// the kind cluster. It publishes a node's fake GPUs (count and memory from the node's
// labels) as a ResourceSlice of driver gpu.fake.modelpool.dev, and prepares a claim's
// devices for its containers with a CDI spec: NVIDIA_VISIBLE_DEVICES, the device's memory
// (MODELPOOL_GPU_MEMORY) and the node's lock and ledger directory, mounted, so the fake
// model servers that share a device charge their footprints to its ledger
// (e2e/fake_model/gpu_ledger.py). Unprepare removes the spec. Registration with the kubelet,
// again after it restarts, and the ResourceSlice's upkeep are the kubeletplugin helper's.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// cdiDir is where the container runtime reads CDI specs that change at run time.
const cdiDir = "/var/run/cdi"

type driver struct {
	pool   string
	gpus   NodeGPUs
	cdiDir string
	cancel context.CancelCauseFunc
	// one prepare or unprepare at a time (the helper serializes them too)
	mu sync.Mutex
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		results[claim.UID] = d.prepare(ctx, claim)
	}
	return results, nil
}

func (d *driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	names, err := ClaimDevices(claim, d.pool)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	for _, name := range names {
		index, err := DeviceIndex(name)
		if err != nil {
			return kubeletplugin.PrepareResult{Err: err}
		}
		if err := makeLedger(HostLockDir, index); err != nil {
			return kubeletplugin.PrepareResult{Err: err}
		}
	}
	spec, err := CDISpec(string(claim.UID), names, d.gpus.MemoryBytes())
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if err := writeFileAtomic(filepath.Join(d.cdiDir, CDISpecFile(string(claim.UID))), spec); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("write the CDI spec: %w", err)}
	}
	klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(claim), "devices", names)
	result := kubeletplugin.PrepareResult{}
	for _, name := range names {
		result.Devices = append(result.Devices, kubeletplugin.Device{
			PoolName:     d.pool,
			DeviceName:   name,
			CDIDeviceIDs: []string{CDIDeviceID(string(claim.UID))},
		})
	}
	return result
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(filepath.Join(d.cdiDir, CDISpecFile(string(claim.UID))))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // not prepared here, or unprepared already
		}
		if err == nil {
			klog.FromContext(ctx).Info("unprepared", "claim", claim)
		}
		results[claim.UID] = err
	}
	return results, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

// makeLedger creates a device's lock file, ledger lock and charges directory, open to the
// model servers' non-root users, as the fake device plugin does.
func makeLedger(dir, index string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	for _, name := range []string{"gpu" + index + ".lock", "gpu" + index + ".ledger"} {
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o666)
		if err != nil {
			return err
		}
		f.Close()
		if err := os.Chmod(path, 0o666); err != nil {
			return err
		}
	}
	charges := filepath.Join(dir, "gpu"+index+".charges")
	if err := os.MkdirAll(charges, 0o777); err != nil {
		return err
	}
	return os.Chmod(charges, 0o777)
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func run() error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-signals; cancel(errors.New("signalled")) }()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		return errors.New("NODE_NAME is not set")
	}
	config, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", nodeName, err)
	}
	gpus, err := FromLabels(node.Labels)
	if err != nil {
		return err
	}
	for i := 0; i < gpus.Count; i++ {
		if err := makeLedger(HostLockDir, fmt.Sprint(i)); err != nil {
			return fmt.Errorf("make the ledger of device %d: %w", i, err)
		}
	}
	d := &driver{pool: nodeName, gpus: gpus, cdiDir: cdiDir, cancel: cancel}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.DriverName(DriverName),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: gpus.Devices()}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return err
	}
	logger.Info("published", "node", nodeName, "devices", gpus.Count, "memoryMiB", gpus.MemoryMiB)
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && cause.Error() != "signalled" {
		return cause
	}
	return nil
}

func main() {
	klog.InitFlags(nil)
	if err := run(); err != nil {
		klog.Background().Error(err, "fake-gpu-dra")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
