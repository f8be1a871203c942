package main

// The configuration files of containerd and the kubelet. Everything they
// write lives under the node's directory, except what the kubelet keeps at
// fixed host paths (see README.md: /var/lib/kubelet/device-plugins,
// /var/log/containers) and the cgroups under cgroupRoot.

import (
	"fmt"
	"path/filepath"
	"strings"
)

// layout names every path of one node under its directory.
type layout struct {
	dir        string
	node       string
	cgroupRoot string // e.g. /podstamp-node-<node>, distinct per node
}

func (l layout) path(parts ...string) string {
	return filepath.Join(append([]string{l.dir}, parts...)...)
}

func (l layout) socket() string           { return l.path("run", "containerd.sock") }
func (l layout) containerdConfig() string { return l.path("containerd.toml") }
func (l layout) kubeletConfig() string    { return l.path("kubelet.yaml") }
func (l layout) manifests() string        { return l.path("manifests") }
func (l layout) podLogs() string          { return l.path("logs", "pods") }
func (l layout) readyFile() string        { return l.path("ready") }

// toml quotes s as a TOML basic string.
func toml(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func containerdConfig(l layout, runc, registryHosts string) string {
	registry := ""
	if registryHosts != "" {
		// containerd reads DIR/HOST:PORT/hosts.toml when it pulls from
		// HOST:PORT (the registry's CA, and headers such as a Basic
		// Authorization: a static pod has no imagePullSecrets).
		registry = fmt.Sprintf("  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = %s\n", toml(registryHosts))
	}
	return fmt.Sprintf(`version = 2
root = %s
state = %s
oom_score = 0
# Snapshotters and runtimes the tests never use.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %s

[ttrpc]
  address = %s

[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %s
  # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %s
        Root = %s
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    # Empty: pods use the host network only.
    bin_dir = %s
    conf_dir = %s
%s`,
		toml(l.path("containerd", "root")),
		toml(l.path("containerd", "state")),
		toml(l.socket()),
		toml(l.socket()+".ttrpc"),
		toml(l.path("containerd", "opt")),
		toml(SandboxImage),
		toml(runc),
		toml(l.path("containerd", "runc")),
		toml(l.path("cni", "bin")),
		toml(l.path("cni", "conf")),
		registry,
	)
}

// kubeletConfig is a KubeletConfiguration. The kubelet ignores unknown fields
// silently, so every name here was checked against
// k8s.io/kubelet/config/v1beta1 (and the kubelet's log, which warns on none).
func kubeletConfig(l layout, port, healthzPort int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %q
fileCheckFrequency: 1s
containerRuntimeEndpoint: %q
imageServiceEndpoint: %q
cgroupDriver: cgroupfs
cgroupRoot: %q
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
localStorageCapacityIsolation: false
evictionHard: {}
# Never garbage-collect the locally imported images: they cannot be pulled.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %q
volumePluginDir: %q
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
registerNode: true
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
`,
		l.manifests(),
		"unix://"+l.socket(),
		"unix://"+l.socket(),
		l.cgroupRoot,
		l.podLogs(),
		l.path("kubelet", "volume-plugins"),
		port,
		healthzPort,
	)
}
