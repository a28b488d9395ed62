package main

// What the driver publishes for a node and what a container that is given a device gets:
// pure functions of the node's labels and of a claim's allocation, no Kubernetes client, no
// files.

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

const (
	// DriverName is the DRA driver's name: ResourceSlices, the DeviceClass and the claims'
	// allocation results carry it.
	DriverName = "gpu.fake.modelpool.dev"
	// CountLabel and MemoryLabel are the node labels the fake device plugin reads too: how
	// many fake GPUs the node has, and each one's memory in MiB.
	CountLabel  = "modelpool.dev/fake-gpus"
	MemoryLabel = "modelpool.dev/fake-gpu-memory-mib"
	// HostLockDir holds each device's lock and memory ledger on the node (the device
	// plugin's directory: both drivers' servers meet in the same ledger); ContainerLockDir
	// is where a container finds it.
	HostLockDir      = "/var/lib/modelpool-fake-gpu/locks"
	ContainerLockDir = "/run/modelpool-gpu-locks"
	// CDIKind is the CDI vendor and class of the devices this driver writes specs for.
	CDIKind = "fake.modelpool.dev/gpu"
	// DevicePrefix names a device in the node's pool: gpu-0, gpu-1, ...
	DevicePrefix = "gpu-"
)

// NodeGPUs is what a node's labels say about its fake GPUs.
type NodeGPUs struct {
	Count     int
	MemoryMiB int64
}

// FromLabels reads a node's fake GPUs from its labels: a count is required (0 to 64), a
// memory (1 MiB to 16 TiB) too, since every device published carries its capacity.
func FromLabels(labels map[string]string) (NodeGPUs, error) {
	raw, ok := labels[CountLabel]
	if !ok {
		return NodeGPUs{}, fmt.Errorf("the node has no label %s", CountLabel)
	}
	count, err := strconv.Atoi(raw)
	if err != nil || count < 0 || count > 64 {
		return NodeGPUs{}, fmt.Errorf("label %s=%q is not a whole number in 0-64", CountLabel, raw)
	}
	raw, ok = labels[MemoryLabel]
	if !ok {
		return NodeGPUs{}, fmt.Errorf("the node has no label %s (each device's memory in MiB)", MemoryLabel)
	}
	mib, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || mib < 1 || mib > 1<<24 {
		return NodeGPUs{}, fmt.Errorf("label %s=%q is not a whole number in 1-%d", MemoryLabel, raw, 1<<24)
	}
	return NodeGPUs{Count: count, MemoryMiB: mib}, nil
}

// MemoryBytes is one device's memory in bytes.
func (g NodeGPUs) MemoryBytes() int64 { return g.MemoryMiB << 20 }

// Devices are the node's devices as a ResourceSlice lists them: gpu-<index>, each with its
// index and its memory.
func (g NodeGPUs) Devices() []resourceapi.Device {
	devices := make([]resourceapi.Device, 0, g.Count)
	for i := 0; i < g.Count; i++ {
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("%s%d", DevicePrefix, i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(g.MemoryBytes(), resource.BinarySI)},
			},
		})
	}
	return devices
}

// DeviceIndex is the NVIDIA_VISIBLE_DEVICES id of a device named gpu-<index>.
func DeviceIndex(name string) (string, error) {
	index, ok := strings.CutPrefix(name, DevicePrefix)
	if _, err := strconv.Atoi(index); !ok || err != nil {
		return "", fmt.Errorf("device %q is not one of this driver's (%s<index>)", name, DevicePrefix)
	}
	return index, nil
}

// ClaimDevices are the names of the devices of this driver's pool that a claim's
// allocation holds, in order, each once.
func ClaimDevices(claim *resourceapi.ResourceClaim, pool string) ([]string, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	seen := map[string]bool{}
	var names []string
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != DriverName {
			continue
		}
		if result.Pool != pool {
			return nil, fmt.Errorf("claim %s/%s holds %s of pool %s, not of this node's pool %s",
				claim.Namespace, claim.Name, result.Device, result.Pool, pool)
		}
		if !seen[result.Device] {
			seen[result.Device] = true
			names = append(names, result.Device)
		}
	}
	sort.Strings(names)
	return names, nil
}

// CDIDeviceID names the CDI device of one claim: the claim's UID, never reused, so a
// runtime's cached spec never answers for another claim.
func CDIDeviceID(claimUID string) string { return CDIKind + "=" + claimUID }

// CDISpec is the CDI spec of one claim's devices: one CDI device whose edits give the
// container the devices' ids, each one's memory and the node's ledger directory, mounted.
func CDISpec(claimUID string, devices []string, memoryBytes int64) ([]byte, error) {
	ids := make([]string, 0, len(devices))
	for _, name := range devices {
		id, err := DeviceIndex(name)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	spec := map[string]any{
		"cdiVersion": "0.6.0",
		"kind":       CDIKind,
		"devices": []any{map[string]any{
			"name": claimUID,
			"containerEdits": map[string]any{
				"env": []string{
					"NVIDIA_VISIBLE_DEVICES=" + strings.Join(ids, ","),
					"MODELPOOL_GPU_MEMORY=" + strconv.FormatInt(memoryBytes, 10),
					"MODELPOOL_GPU_LOCK_DIR=" + ContainerLockDir,
				},
				"mounts": []any{map[string]any{
					"hostPath":      HostLockDir,
					"containerPath": ContainerLockDir,
					"options":       []string{"rbind", "rw", "nosuid", "nodev"},
				}},
			},
		}},
	}
	return json.MarshalIndent(spec, "", "  ")
}

// CDISpecFile is the file name of a claim's CDI spec in the runtime's spec directory.
func CDISpecFile(claimUID string) string {
	return strings.ReplaceAll(DriverName, ".", "-") + "_" + claimUID + ".json"
}
