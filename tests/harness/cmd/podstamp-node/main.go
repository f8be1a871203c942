// Command podstamp-node brings up one Kubernetes node for podstamp's
// end-to-end tests: containerd (the host's, as a child process, with all its
// state under --dir), two locally built images (busybox and a sandbox image;
// no registry is reachable) and the real kubelet, registered as --node-name
// with the API server of --kubeconfig, reading static pods from
// DIR/manifests. It writes DIR/ready when the Node object exists, and on
// SIGTERM/SIGINT tears everything down in order: kubelet, pod sandboxes
// (through the CRI), containerd, leftover shims and container processes (by
// PID), mounts under DIR, the cgroups under its cgroupRoot. See
// ../../README.md.
//
//	podstamp-node --dir DIR --kubeconfig FILE --node-name NAME [--registry-hosts DIR]
//	podstamp-node containers --dir DIR    (JSON: the node's containers)
//	podstamp-node stop --dir DIR --id ID  (kill one container through the CRI)
//
// SIGUSR1 restarts the kubelet alone (SIGTERM, then the same binary, config
// and flags; its containers keep running, as on a node whose kubelet is
// restarted by systemd): DIR/ready is written again with kubeletRestarts
// counted and the new kubeletPid once its /healthz answers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const installHint = "install it with: apt-get install containerd runc busybox-static"

// Exit codes.
const (
	exitFailed     = 1
	exitUsage      = 2
	exitMissingDep = 3
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "podstamp-node: "+format+"\n", args...)
}

func fatalf(code int, format string, args ...any) {
	logf(format, args...)
	os.Exit(code)
}

type options struct {
	dir          string
	kubeconfig   string
	node         string
	kubelet      string
	verbosity    int
	readyTimeout time.Duration
	// registryHosts is containerd's CRI registry config_path: a directory
	// of HOST[:PORT]/hosts.toml files (CA, headers) for the registries
	// pods pull from; empty means none (only the imported images).
	registryHosts string
	// id is the container of the stop subcommand.
	id string
	// images are extra local images built from host binaries.
	images imageFlags
	// standalone: the API server of --kubeconfig may not exist yet (it
	// may be one of this node's own static pods), so ready does not wait
	// for the Node: the kubelet runs static pods meanwhile and registers
	// once the API server answers.
	standalone bool
}

func parseFlags(args []string) options {
	var o options
	fs := flag.NewFlagSet("podstamp-node", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "", "the node's directory (required): containerd, kubelet, logs, manifests")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server the kubelet registers with")
	fs.StringVar(&o.node, "node-name", "podstamp-node", "the Node's name")
	fs.StringVar(&o.kubelet, "kubelet", "", "kubelet binary (default: next to this binary)")
	fs.IntVar(&o.verbosity, "v", 0, "kubelet klog verbosity")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 120*time.Second, "give up when not ready by then")
	fs.StringVar(&o.registryHosts, "registry-hosts", "", "containerd's CRI registry config_path: a directory of HOST:PORT/hosts.toml")
	fs.StringVar(&o.id, "id", "", "stop: the container's id")
	fs.Var(&o.images, "image", "NAME=BINARY: also import an image NAME with busybox, BINARY at /bin/ and its shared libraries (repeatable)")
	fs.BoolVar(&o.standalone, "standalone", false, "ready once the kubelet's healthz answers, before any API server does (a self-hosted control plane)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(exitUsage)
	}
	if o.dir == "" {
		fatalf(exitUsage, "--dir is required")
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		fatalf(exitUsage, "--dir: %v", err)
	}
	o.dir = dir
	if o.registryHosts != "" {
		hosts, err := filepath.Abs(o.registryHosts)
		if err != nil {
			fatalf(exitUsage, "--registry-hosts: %v", err)
		}
		o.registryHosts = hosts
	}
	return o
}

// lookPath finds a host tool or exits with how to install it.
func lookPath(name string) string {
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		if path := filepath.Join(dir, name); fileExists(path) {
			return path
		}
	}
	fatalf(exitMissingDep, "%s not found on PATH; %s", name, installHint)
	return ""
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func freePorts(n int) ([]int, error) {
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// proc is a child process; done closes when it has exited.
type proc struct {
	what string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (p *proc) exited() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// child starts a process logging to file (emptied first), killed if this process dies
// (main locks its OS thread, so the thread that forks it lives as long as we do).
func child(what, log, name string, args ...string) (*proc, error) {
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	// Its own process group: a signal to ours (Ctrl-C, timeout(1)) reaches
	// only podstamp-node, which stops the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	p := &proc{what: what, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		logf("%s did not stop within %s: SIGKILL", p.what, grace)
		p.cmd.Process.Kill()
		<-p.done
	}
}

type node struct {
	l          layout
	containerd *proc
	kubelet    *proc
	// kubeletPath and kubeletArgs start the kubelet, again on SIGUSR1.
	kubeletPath string
	kubeletArgs []string
	// ports are the kubelet's (server, healthz); healthz its URL.
	ports   []int
	healthz string
	// restarts counts the kubelet's restarts on SIGUSR1.
	restarts int
}

// died reports a child that exited while it should run.
func (n *node) died() error {
	for _, p := range []*proc{n.containerd, n.kubelet} {
		if p.exited() {
			return fmt.Errorf("%s exited: %v", p.what, p.err)
		}
	}
	return nil
}

// teardown stops everything in order and reports what could not be removed.
func (n *node) teardown() error {
	n.kubelet.stop(10 * time.Second)
	var errs []error
	if n.containerd != nil {
		if err := removeAllPods(n.l.socket()); err != nil {
			errs = append(errs, err)
		}
	}
	n.containerd.stop(10 * time.Second)
	if err := sweep(n.l); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func waitFor(ctx context.Context, what string, probe func() (bool, error)) error {
	var last error
	for {
		ok, err := probe()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (n *node) bringUp(ctx context.Context, o options) error {
	l := n.l
	containerd := lookPath("containerd")
	runc := lookPath("runc")
	ctr := lookPath("ctr")
	lookPath("containerd-shim-runc-v2")
	kubelet := o.kubelet
	if kubelet == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		kubelet = filepath.Join(filepath.Dir(self), "kubelet")
	}
	if !fileExists(kubelet) {
		fatalf(exitMissingDep, "kubelet not found at %s; build it with: bash tests/harness/build.sh", kubelet)
	}
	if len(l.socket()) > 100 {
		return fmt.Errorf("socket path %s is too long for a unix socket: use a shorter --dir", l.socket())
	}
	images, err := buildImages(l.path("images"), o.images)
	if err != nil {
		return err
	}
	for _, d := range []string{"run", "cni/bin", "cni/conf", "logs/pods", "manifests", "kubelet/volume-plugins"} {
		if err := os.MkdirAll(l.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(l.containerdConfig(), []byte(containerdConfig(l, runc, o.registryHosts)), 0o644); err != nil {
		return err
	}
	if err := makeCgroupRoot(l.cgroupRoot); err != nil {
		return err
	}

	n.containerd, err = child("containerd", l.path("containerd.log"), containerd, "--config", l.containerdConfig())
	if err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	ready := func(what string, probe func() (bool, error)) error {
		return waitFor(ctx, what, func() (bool, error) {
			if err := n.died(); err != nil {
				return false, err
			}
			return probe()
		})
	}
	err = ready("containerd's CRI", func() (bool, error) {
		client, closeConn, err := dialCRI(l.socket())
		if err != nil {
			return false, err
		}
		defer closeConn()
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		status, err := client.Status(c, &runtimeapi.StatusRequest{})
		if err != nil {
			return false, err
		}
		for _, cond := range status.GetStatus().GetConditions() {
			if cond.Type == runtimeapi.RuntimeReady && !cond.Status {
				return false, fmt.Errorf("RuntimeReady false: %s", cond.Message)
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w; see %s", err, l.path("containerd.log"))
	}
	for _, image := range images {
		out, err := exec.CommandContext(ctx, ctr, "--address", l.socket(), "-n", "k8s.io", "images", "import", image).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", image, err, out)
		}
	}

	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	if err := os.WriteFile(l.kubeletConfig(), []byte(kubeletConfig(l, ports[0], ports[1])), 0o644); err != nil {
		return err
	}
	n.kubeletPath = kubelet
	n.kubeletArgs = []string{
		"--config", l.kubeletConfig(),
		"--kubeconfig", o.kubeconfig,
		"--hostname-override", o.node,
		"--root-dir", l.path("kubelet", "root"),
		"--cert-dir", l.path("kubelet", "pki"),
		fmt.Sprintf("--v=%d", o.verbosity),
	}
	n.ports = ports
	n.healthz = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[1])
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	healthz := n.healthz
	if o.standalone {
		// The kubelet runs static pods without its API server: the
		// control plane it will register with may be one of them.
		return n.writeReady(o, ports, healthz)
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	// The first mirror pod waits for the Node: ready means registered.
	err = ready("the Node "+o.node, func() (bool, error) {
		_, err := clientset.CoreV1().Nodes().Get(ctx, o.node, metav1.GetOptions{})
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("%w; see %s", err, l.path("kubelet.log"))
	}
	// The kubelet watches its pods in the API only once its own informer has
	// the Node (polled every second). A static pod started before that gets
	// its mirror pod's status only at the status manager's next 10 s resync,
	// so wait for it too. Nothing outside tells, so read its log (the line
	// is logged at every verbosity); carry on after 10 s without it.
	watching, cancelWatching := context.WithTimeout(ctx, 10*time.Second)
	err = waitFor(watching, "the kubelet's API pod source", func() (bool, error) {
		if err := n.died(); err != nil {
			return false, err
		}
		log, err := os.ReadFile(l.path("kubelet.log"))
		return strings.Contains(string(log), `"Watching apiserver"`), err
	})
	cancelWatching()
	if err != nil {
		if ctx.Err() != nil || n.died() != nil {
			return err
		}
		logf("%v: ready anyway; the first mirror pod may take 10 s longer", err)
	}
	return n.writeReady(o, ports, healthz)
}

// startKubelet starts the kubelet with the node's flags and waits for its
// /healthz. The log of an earlier kubelet of this run is kept, as
// kubelet.log.N (N its restart), for what it did before it stopped.
func (n *node) startKubelet(ctx context.Context) error {
	log := n.l.path("kubelet.log")
	if n.restarts > 0 {
		if err := os.Rename(log, fmt.Sprintf("%s.%d", log, n.restarts-1)); err != nil {
			return err
		}
	}
	var err error
	n.kubelet, err = child("kubelet", log, n.kubeletPath, n.kubeletArgs...)
	if err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	err = waitFor(ctx, "the kubelet's "+n.healthz, func() (bool, error) {
		if err := n.died(); err != nil {
			return false, err
		}
		resp, err := http.Get(n.healthz)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("%w; see %s", err, log)
	}
	return nil
}

// restartKubelet stops the kubelet (SIGTERM, SIGKILL after 10 s) and starts
// it again with the same binary, config and flags, as systemd restarts a
// node's kubelet; containerd and the containers keep running. Then DIR/ready
// says so (kubeletRestarts, kubeletPid).
func (n *node) restartKubelet(ctx context.Context, o options) error {
	old := n.kubelet.cmd.Process.Pid
	n.kubelet.stop(10 * time.Second)
	n.restarts++
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	logf("kubelet restarted (SIGUSR1): pid %d -> %d", old, n.kubelet.cmd.Process.Pid)
	return n.writeReady(o, n.ports, n.healthz)
}

// writeReady writes DIR/ready: what a test needs to know of the node.
func (n *node) writeReady(o options, ports []int, healthz string) error {
	l := n.l
	line, _ := json.Marshal(map[string]any{
		"pid":         os.Getpid(),
		"node":        o.node,
		"runtime":     "unix://" + l.socket(),
		"manifests":   l.manifests(),
		"cgroupRoot":  l.cgroupRoot,
		"kubeletPort": ports[0],
		"healthz":     healthz,
		// The kubelet's own, and how many times SIGUSR1 restarted it.
		"kubeletPid":      n.kubelet.cmd.Process.Pid,
		"kubeletRestarts": n.restarts,
	})
	return writeFileAtomic(l.readyFile(), append(line, '\n'), 0o644)
}

func run(o options) int {
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		fatalf(exitFailed, "%v", err)
	}
	// Mount points are listed with symlinks resolved: so must the directory be.
	if dir, err := filepath.EvalSymlinks(o.dir); err == nil {
		o.dir = dir
	} else {
		fatalf(exitFailed, "%v", err)
	}
	l := layout{dir: o.dir, node: o.node, cgroupRoot: "/podstamp-node-" + o.node}
	os.Remove(l.readyFile())
	lock, err := os.OpenFile(l.path(".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fatalf(exitFailed, "%v", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fatalf(exitFailed, "another podstamp-node runs on %s: %v", o.dir, err)
	}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	// SIGUSR1: restart the kubelet. Done by the loop below, on the thread
	// that forked the first one (Pdeathsig is per forking thread).
	restart := make(chan os.Signal, 1)
	signal.Notify(restart, syscall.SIGUSR1)
	// stopped ends on a signal; ctx also when bring-up takes too long.
	stopped, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		<-signals
		logf("signal: tearing down")
		stop()
	}()
	ctx, cancel := context.WithTimeout(stopped, o.readyTimeout)
	defer cancel()

	// What a SIGKILLed run on this directory left, then its state.
	if err := sweep(l); err != nil {
		fatalf(exitFailed, "cleaning up a previous run: %v", err)
	}
	for _, d := range []string{"containerd", "kubelet", "run", "logs", "manifests"} {
		if err := os.RemoveAll(l.path(d)); err != nil {
			fatalf(exitFailed, "%v", err)
		}
	}

	n := &node{l: l}
	start := time.Now()
	code := 0
	if err := n.bringUp(ctx, o); err != nil {
		if stopped.Err() != nil {
			logf("stopped before ready")
		} else {
			logf("%v", err)
			code = exitFailed
		}
	} else {
		logf("node %s ready after %s", o.node, time.Since(start).Round(time.Millisecond))
		// Until a signal (ctx is cancelled on one) or a child's death.
		for stopped.Err() == nil {
			if err := n.died(); err != nil {
				logf("%v; see the logs in %s", err, o.dir)
				code = exitFailed
				break
			}
			select {
			case <-restart:
				// Bounded like the first start's healthz wait.
				c, cancelRestart := context.WithTimeout(stopped, o.readyTimeout)
				err := n.restartKubelet(c, o)
				cancelRestart()
				if err != nil && stopped.Err() == nil {
					logf("restarting the kubelet: %v", err)
					code = exitFailed
				}
			case <-time.After(200 * time.Millisecond):
			}
			if code != 0 {
				break
			}
		}
	}
	os.Remove(l.readyFile())
	if err := n.teardown(); err != nil {
		logf("teardown: %v", err)
		code = exitFailed
	} else {
		logf("torn down")
	}
	return code
}

func main() {
	// Children get Pdeathsig from the thread that forks them: keep it one thread.
	runtime.LockOSThread()
	if len(os.Args) > 1 && os.Args[1] == "containers" {
		o := parseFlags(os.Args[2:])
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		containers, err := listContainers(ctx, layout{dir: o.dir}.socket())
		if err != nil {
			fatalf(exitFailed, "%v", err)
		}
		out, _ := json.Marshal(containers)
		fmt.Println(string(out))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "stop" {
		o := parseFlags(os.Args[2:])
		if o.id == "" {
			fatalf(exitUsage, "stop: --id is required")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := stopContainer(ctx, layout{dir: o.dir}.socket(), o.id); err != nil {
			fatalf(exitFailed, "%v", err)
		}
		return
	}
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		fatalf(exitUsage, "unknown subcommand %q (want: containers, stop, or flags)", os.Args[1])
	}
	o := parseFlags(os.Args[1:])
	if o.kubeconfig == "" {
		fatalf(exitUsage, "--kubeconfig is required")
	}
	os.Exit(run(o))
}
