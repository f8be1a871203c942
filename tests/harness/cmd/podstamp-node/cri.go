package main

// The node's containers through the CRI, as the kubelet sees them (there is
// no crictl here): the `containers` subcommand lists them for the tests, and
// teardown stops and removes every pod sandbox, which kills and deletes the
// tasks and unmounts their rootfs and shm before containerd stops.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func dialCRI(socket string) (runtimeapi.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// Container is one line of `podstamp-node containers`.
type Container struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	PodName      string   `json:"podName"`
	PodNamespace string   `json:"podNamespace"`
	Attempt      uint32   `json:"attempt"`
	State        string   `json:"state"`
	Image        string   `json:"image"`
	Args         []string `json:"args"`
	Env          []string `json:"env"`
	PID          int      `json:"pid"`
}

// listContainers returns every container (all states) with its process's
// arguments and environment from the runtime spec containerd keeps.
func listContainers(ctx context.Context, socket string) ([]Container, error) {
	client, closeConn, err := dialCRI(socket)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	resp, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI ListContainers: %w", err)
	}
	out := []Container{}
	for _, c := range resp.Containers {
		item := Container{
			ID:           c.Id,
			Name:         c.GetMetadata().GetName(),
			Attempt:      c.GetMetadata().GetAttempt(),
			PodName:      c.Labels["io.kubernetes.pod.name"],
			PodNamespace: c.Labels["io.kubernetes.pod.namespace"],
			State:        c.State.String(),
			Image:        c.GetImage().GetImage(),
		}
		status, err := client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id, Verbose: true})
		if err == nil {
			var info struct {
				PID         int `json:"pid"`
				RuntimeSpec struct {
					Process struct {
						Args []string `json:"args"`
						Env  []string `json:"env"`
					} `json:"process"`
				} `json:"runtimeSpec"`
			}
			if json.Unmarshal([]byte(status.Info["info"]), &info) == nil {
				item.Args = info.RuntimeSpec.Process.Args
				item.Env = info.RuntimeSpec.Process.Env
				item.PID = info.PID
			}
		}
		out = append(out, item)
	}
	return out, nil
}

// removeAllPods stops and removes every pod sandbox (and so its containers).
func removeAllPods(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, closeConn, err := dialCRI(socket)
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("CRI ListPodSandbox: %w", err)
	}
	var firstErr error
	for _, s := range resp.Items {
		if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("stop sandbox %s: %w", s.Id, err)
		}
		if _, err := client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("remove sandbox %s: %w", s.Id, err)
		}
	}
	return firstErr
}

// stopContainer stops one container through the CRI with no grace period
// (SIGKILL), as a crash would end it; the kubelet then restarts it per the
// pod's restartPolicy. The container is named by its id, never by name.
func stopContainer(ctx context.Context, socket, id string) error {
	client, closeConn, err := dialCRI(socket)
	if err != nil {
		return err
	}
	defer closeConn()
	if _, err := client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		return fmt.Errorf("CRI StopContainer %s: %w", id, err)
	}
	return nil
}
