package main

// What a node leaves outside its own processes, and how it goes: containerd
// shims (they outlive containerd by design), container processes (children
// of the shims), the cgroups under cgroupRoot, the mounts under the node's
// directory and the kubelet's symlinks in /var/log/containers. Processes are
// found precisely (a shim's -address is our socket; a container's cgroup is
// under our cgroupRoot) and killed by PID, never by name. The same sweep runs
// before a start, for what a SIGKILLed previous run on the same directory
// left.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const cgroupMount = "/sys/fs/cgroup"

// cmdline returns a process's arguments, nil when it is gone.
func cmdline(pid int) []string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(raw) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

func pids() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// shimPIDs are the containerd shims started by the containerd on socket.
func shimPIDs(socket string) []int {
	var out []int
	for _, pid := range pids() {
		args := cmdline(pid)
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == socket {
				out = append(out, pid)
			}
		}
	}
	return out
}

// cgroupDirs lists every cgroup directory at or below root in every
// hierarchy (cgroup v1 controllers, the named systemd one, the unified one),
// deepest first.
func cgroupDirs(root string) []string {
	var dirs []string
	hierarchies, _ := os.ReadDir(cgroupMount)
	for _, h := range hierarchies {
		if !h.IsDir() { // cpu -> cpu,cpuacct style symlinks
			continue
		}
		base := filepath.Join(cgroupMount, h.Name(), root)
		filepath.WalkDir(base, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// cgroupPIDs are the processes in any cgroup at or below root.
func cgroupPIDs(root string) []int {
	seen := map[int]bool{}
	var out []int
	for _, dir := range cgroupDirs(root) {
		raw, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(raw)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// mountsUnder lists the mount points at or below dir, deepest (latest) first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func killAll(pids []int, what string) {
	for _, pid := range pids {
		if pid == os.Getpid() {
			continue
		}
		logf("killing %s %d", what, pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// sweep removes everything the node may have left; it returns what remains.
func sweep(l layout) error {
	var problems []error
	killAll(shimPIDs(l.socket()), "leftover containerd shim")
	// Container processes lose their shim above; they are in our cgroups.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := cgroupPIDs(l.cgroupRoot)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			problems = append(problems, fmt.Errorf("processes still in cgroup %s: %v", l.cgroupRoot, left))
			break
		}
		killAll(left, "leftover container process")
		time.Sleep(100 * time.Millisecond)
	}
	for attempt := 0; ; attempt++ {
		mounts := mountsUnder(l.dir)
		if len(mounts) == 0 {
			break
		}
		if attempt == 5 {
			problems = append(problems, fmt.Errorf("still mounted: %v", mounts))
			break
		}
		for _, mp := range mounts {
			if err := syscall.Unmount(mp, 0); err != nil {
				// Busy: detach it, the kernel finishes when the last user goes.
				syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
	for attempt := 0; ; attempt++ {
		var failed []string
		for _, dir := range cgroupDirs(l.cgroupRoot) {
			if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
				failed = append(failed, fmt.Sprintf("%s: %v", dir, err))
			}
		}
		if len(failed) == 0 {
			break
		}
		if attempt == 20 {
			problems = append(problems, fmt.Errorf("cgroups not removed: %v", failed))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	removeLogLinks(l.podLogs())
	return errors.Join(problems...)
}

// removeLogLinks removes the kubelet's /var/log/containers symlinks into podLogs.
func removeLogLinks(podLogs string) {
	entries, _ := os.ReadDir("/var/log/containers")
	for _, e := range entries {
		link := filepath.Join("/var/log/containers", e.Name())
		if target, err := os.Readlink(link); err == nil && strings.HasPrefix(target, podLogs+"/") {
			os.Remove(link)
		}
	}
}

// makeCgroupRoot creates cgroupRoot in every hierarchy: the kubelet refuses a
// cgroupRoot that does not exist. A new v1 cpuset starts with no CPUs and no
// memory nodes; it gets its parent's, or nothing below it could run.
func makeCgroupRoot(root string) error {
	hierarchies, err := os.ReadDir(cgroupMount)
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		if !h.IsDir() {
			continue
		}
		parent := filepath.Join(cgroupMount, h.Name())
		dir := filepath.Join(parent, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			value, err := os.ReadFile(filepath.Join(parent, file))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, file), value, 0o644); err != nil {
				return fmt.Errorf("write %s: %w", filepath.Join(dir, file), err)
			}
		}
	}
	return nil
}
