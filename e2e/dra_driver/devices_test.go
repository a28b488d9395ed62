package main

import (
	"encoding/json"
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestFromLabels(t *testing.T) {
	gpus, err := FromLabels(map[string]string{CountLabel: "2", MemoryLabel: "1024"})
	if err != nil || gpus != (NodeGPUs{Count: 2, MemoryMiB: 1024}) {
		t.Fatalf("got %+v, %v", gpus, err)
	}
	for _, labels := range []map[string]string{
		{MemoryLabel: "1024"},
		{CountLabel: "2"},
		{CountLabel: "two", MemoryLabel: "1024"},
		{CountLabel: "65", MemoryLabel: "1024"},
		{CountLabel: "-1", MemoryLabel: "1024"},
		{CountLabel: "1", MemoryLabel: "0"},
		{CountLabel: "1", MemoryLabel: "1Gi"},
	} {
		if _, err := FromLabels(labels); err == nil {
			t.Errorf("%v: no error", labels)
		}
	}
}

func TestDevicesCarryIndexAndMemory(t *testing.T) {
	devices := NodeGPUs{Count: 2, MemoryMiB: 1024}.Devices()
	if len(devices) != 2 || devices[0].Name != "gpu-0" || devices[1].Name != "gpu-1" {
		t.Fatalf("devices %+v", devices)
	}
	memory := devices[1].Capacity["memory"].Value
	if memory.Value() != 1<<30 || memory.String() != "1Gi" {
		t.Errorf("memory %s", memory.String())
	}
	if *devices[1].Attributes["index"].IntValue != 1 {
		t.Errorf("index %v", devices[1].Attributes["index"])
	}
}

func claim(results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.Namespace, c.Name = "ns", "c"
	c.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: results},
	}
	return c
}

func TestClaimDevices(t *testing.T) {
	c := claim(
		resourceapi.DeviceRequestAllocationResult{Request: "a", Driver: DriverName, Pool: "n", Device: "gpu-1"},
		resourceapi.DeviceRequestAllocationResult{Request: "b", Driver: "other.dev", Pool: "n", Device: "x"},
		resourceapi.DeviceRequestAllocationResult{Request: "c", Driver: DriverName, Pool: "n", Device: "gpu-0"},
		resourceapi.DeviceRequestAllocationResult{Request: "d", Driver: DriverName, Pool: "n", Device: "gpu-1"},
	)
	names, err := ClaimDevices(c, "n")
	if err != nil || !reflect.DeepEqual(names, []string{"gpu-0", "gpu-1"}) {
		t.Fatalf("got %v, %v", names, err)
	}
	if _, err := ClaimDevices(c, "another-node"); err == nil {
		t.Error("a device of another node's pool was taken")
	}
	if _, err := ClaimDevices(&resourceapi.ResourceClaim{}, "n"); err == nil {
		t.Error("an unallocated claim was taken")
	}
}

func TestCDISpec(t *testing.T) {
	raw, err := CDISpec("uid-1", []string{"gpu-0", "gpu-1"}, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Kind    string
		Devices []struct {
			Name           string
			ContainerEdits struct {
				Env    []string
				Mounts []struct{ HostPath, ContainerPath string }
			}
		}
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Kind != CDIKind || len(spec.Devices) != 1 || spec.Devices[0].Name != "uid-1" {
		t.Fatalf("spec %s", raw)
	}
	edits := spec.Devices[0].ContainerEdits
	want := []string{"NVIDIA_VISIBLE_DEVICES=0,1", "MODELPOOL_GPU_MEMORY=1073741824",
		"MODELPOOL_GPU_LOCK_DIR=/run/modelpool-gpu-locks"}
	if !reflect.DeepEqual(edits.Env, want) {
		t.Errorf("env %v", edits.Env)
	}
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != HostLockDir || edits.Mounts[0].ContainerPath != ContainerLockDir {
		t.Errorf("mounts %+v", edits.Mounts)
	}
	if CDIDeviceID("uid-1") != "fake.modelpool.dev/gpu=uid-1" {
		t.Errorf("id %s", CDIDeviceID("uid-1"))
	}
	if _, err := CDISpec("uid-1", []string{"tpu-0"}, 1); err == nil {
		t.Error("a device not of this driver was given an id")
	}
}
