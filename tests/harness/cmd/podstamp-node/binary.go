package main

// Images of host binaries (--image NAME=BINARY): the harness's own API
// server run by the kubelet as a static pod, for one. Such a binary is
// linked against libc only (Go with cgo's resolver), so the image carries
// the binary at /bin/<its name> and every shared object it loads, found the
// way the dynamic loader finds them (its .interp, then DT_NEEDED in the
// loader's default directories), copied to the same paths: the image has no
// ld.so.cache, and Debian's loader searches its multiarch directories by
// default, so a library kept where it was found is found again.

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// binaryImage is one --image NAME=BINARY.
type binaryImage struct {
	name   string
	binary string
}

// imageFlags collects repeated --image flags.
type imageFlags []binaryImage

func (f *imageFlags) String() string { return fmt.Sprint(*f) }

func (f *imageFlags) Set(v string) error {
	name, binary, ok := strings.Cut(v, "=")
	if !ok || name == "" || binary == "" {
		return fmt.Errorf("want NAME=BINARY, e.g. podstamp.test/apiserver:1=target/harness/podstamp-apiserver")
	}
	abs, err := filepath.Abs(binary)
	if err != nil {
		return err
	}
	if !fileExists(abs) {
		return fmt.Errorf("%s does not exist", abs)
	}
	*f = append(*f, binaryImage{name: name, binary: abs})
	return nil
}

// Where the loader looks for a DT_NEEDED library with no ld.so.cache.
var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// sharedObjects returns the loader and every library binary needs,
// transitively, as the paths the loader opens.
func sharedObjects(binary string) ([]string, error) {
	found := map[string]bool{}
	queue := []string{binary}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		f, err := elf.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var needs []string
		if interp := f.Section(".interp"); interp != nil {
			data, err := interp.Data()
			if err != nil {
				f.Close()
				return nil, err
			}
			loader := strings.TrimRight(string(data), "\x00")
			if !found[loader] {
				found[loader] = true
				queue = append(queue, loader)
			}
		}
		libs, err := f.ImportedLibraries()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		needs = append(needs, libs...)
		for _, lib := range needs {
			located := ""
			for _, dir := range libraryDirs {
				if candidate := filepath.Join(dir, lib); fileExists(candidate) {
					located = candidate
					break
				}
			}
			if located == "" {
				return nil, fmt.Errorf("%s needs %s, found in none of %v", path, lib, libraryDirs)
			}
			if !found[located] {
				found[located] = true
				queue = append(queue, located)
			}
		}
	}
	var out []string
	for path := range found {
		out = append(out, path)
	}
	sort.Strings(out)
	return out, nil
}

// binaryLayer is a layer with binary at /bin/<name> and its shared objects
// at their own paths (the content of what each symlink points to).
func binaryLayer(binary string) ([]byte, error) {
	objects, err := sharedObjects(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{"bin": true}
	add := func(name, from string) error {
		data, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		var parents []string
		for d := filepath.Dir(name); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	}
	if err := add("bin/"+filepath.Base(binary), binary); err != nil {
		return nil, err
	}
	for _, object := range objects {
		// The loader opens the path; the file behind a symlink is what it maps.
		if err := add(strings.TrimPrefix(object, "/"), object); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
