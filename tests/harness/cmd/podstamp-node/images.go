package main

// Local OCI images: no registry can be reached from the tests, so the app
// image and the sandbox ("pause") image are built here from the host's static
// busybox, written as OCI image layout tarballs that `ctr images import`
// reads. The io.containerd.image.name annotation gives each its exact name.
// A test may add images of its own host binaries (--image NAME=BINARY, see
// binary.go): busybox plus the binary and the shared libraries it loads.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

const (
	// AppImage runs what a test asks (sh, sleep, env, ...).
	AppImage = "podstamp.test/busybox:1"
	// SandboxImage is containerd's sandbox_image: it only has to stay up.
	SandboxImage = "podstamp.test/pause:1"
	// busybox applets linked into the images.
	busyboxPath = "/bin/busybox"
)

var applets = []string{"sh", "sleep", "env", "cat", "echo", "ls", "true", "false", "printenv"}

type blob struct {
	mediaType string
	data      []byte
}

func (b blob) digest() string {
	sum := sha256.Sum256(b.data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (b blob) descriptor() map[string]any {
	return map[string]any{"mediaType": b.mediaType, "digest": b.digest(), "size": len(b.data)}
}

// busyboxLayer is an uncompressed layer: /bin/busybox and symlinks for applets.
func busyboxLayer() ([]byte, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := []string{"bin/", "tmp/", "etc/", "proc/", "sys/", "dev/"}
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, a := range applets {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeImage writes an OCI image layout tarball named `name` running cmd,
// its layers in order.
func writeImage(path, name string, layers [][]byte, cmd []string) error {
	var layerBlobs []blob
	var diffIDs []string
	var layerDescs []any
	for _, layer := range layers {
		b := blob{"application/vnd.oci.image.layer.v1.tar", layer}
		layerBlobs = append(layerBlobs, b)
		diffIDs = append(diffIDs, b.digest())
		layerDescs = append(layerDescs, b.descriptor())
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/bin"},
			"Cmd": cmd,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return err
	}
	configBlob := blob{"application/vnd.oci.image.config.v1+json", config}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configBlob.descriptor(),
		"layers":        layerDescs,
	})
	if err != nil {
		return err
	}
	manifestBlob := blob{"application/vnd.oci.image.manifest.v1+json", manifest}
	desc := manifestBlob.descriptor()
	desc["annotations"] = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	}
	desc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{desc},
	})
	if err != nil {
		return err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	for _, b := range append(layerBlobs, configBlob, manifestBlob) {
		if err := add("blobs/sha256/"+b.digest()[len("sha256:"):], b.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return writeFileAtomic(path, buf.Bytes(), 0o644)
}

// buildImages writes the two image tarballs, and one per extra image
// (binaryImage), into dir and returns their paths.
func buildImages(dir string, extra []binaryImage) ([]string, error) {
	layer, err := busyboxLayer()
	if err != nil {
		return nil, fmt.Errorf("read %s (apt-get install busybox-static): %w", busyboxPath, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	app := filepath.Join(dir, "busybox.tar")
	// As PID 1 sleep ignores SIGTERM; the sandbox is always stopped with SIGKILL.
	pause := filepath.Join(dir, "pause.tar")
	if err := writeImage(app, AppImage, [][]byte{layer}, []string{"/bin/sh"}); err != nil {
		return nil, err
	}
	if err := writeImage(pause, SandboxImage, [][]byte{layer}, []string{"/bin/sleep", "2147483647"}); err != nil {
		return nil, err
	}
	paths := []string{app, pause}
	for i, image := range extra {
		top, err := binaryLayer(image.binary)
		if err != nil {
			return nil, fmt.Errorf("--image %s=%s: %w", image.name, image.binary, err)
		}
		path := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		cmd := []string{"/bin/" + filepath.Base(image.binary)}
		if err := writeImage(path, image.name, [][]byte{layer, top}, cmd); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}
