// Command podstamp-apiserver runs an embedded etcd and a real, in-process
// kube-apiserver on 127.0.0.1 for podstamp's end-to-end tests.
//
// State (ports, PKI, tokens, etcd data) lives in --dir and is reused on the
// next start with the same dir, so a test can kill the process and start it
// again at the same URL. See ../../README.md.
//
// Two more shapes, for a control plane of several members on one etcd
// (kubeadm's external-etcd topology): --etcd-only serves only the etcd,
// --etcd-servers runs only the API server, on that etcd (external.go); and
// --host puts a member on its own loopback address (the members of a
// control plane share a port, each on its own node's address).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	_ "time/tzdata" // as in cmd/kube-apiserver: time zone support for CronJob

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as in cmd/kube-apiserver
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as in cmd/kube-apiserver
	_ "k8s.io/component-base/metrics/prometheus/version"  // as in cmd/kube-apiserver
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	kubeoptions "k8s.io/kubernetes/pkg/kubeapiserver/options"
)

// Admission plugins kept on by default: enough for realistic PodTemplate
// semantics (namespace lifecycle, webhooks / ValidatingAdmissionPolicy if a
// test installs them); every other default-on plugin is disabled.
const defaultAdmission = "NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy"

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "podstamp-apiserver: "+format+"\n", args...)
}

func fatalf(code int, format string, args ...any) {
	logf(format, args...)
	os.Exit(code)
}

type options struct {
	dir                    string
	etcdCompactionInterval string
	watchCache             string
	verbosity              int
	etcdLogLevel           string
	etcdUnsafeNoFsync      bool
	admission              string
	readyTimeout           time.Duration
	etcdServers            string
	etcdOnly               bool
	host                   string
	extra                  []string
}

func parseFlags() options {
	var o options
	fs := flag.NewFlagSet("podstamp-apiserver", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: podstamp-apiserver --dir DIR [flags] [-- extra kube-apiserver flags...]\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.dir, "dir", "", "state dir (required); created if missing, reused on later starts")
	fs.StringVar(&o.etcdCompactionInterval, "etcd-compaction-interval", "", "passed to kube-apiserver --etcd-compaction-interval (e.g. 5s); empty = kube-apiserver default (5m0s)")
	fs.StringVar(&o.watchCache, "watch-cache", "", "passed to kube-apiserver --watch-cache (true|false); empty = kube-apiserver default (true)")
	fs.IntVar(&o.verbosity, "v", 0, "klog verbosity of kube-apiserver")
	fs.StringVar(&o.etcdLogLevel, "etcd-log-level", "error", "embedded etcd log level (debug|info|warn|error)")
	fs.BoolVar(&o.etcdUnsafeNoFsync, "etcd-unsafe-no-fsync", true, "disable fsync in embedded etcd (survives process kills, not machine crashes)")
	fs.StringVar(&o.admission, "admission-plugins", defaultAdmission, "admission plugins to keep enabled; all other default-on plugins are disabled")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 120*time.Second, "exit 1 if not ready within this time")
	fs.StringVar(&o.etcdServers, "etcd-servers", "", "an external etcd (e.g. http://127.0.0.1:2379): no embedded etcd, the API server stores there")
	fs.StringVar(&o.host, "host", "127.0.0.1", "the loopback address the API server binds, advertises, is certified for and is named by in the kubeconfigs")
	fs.BoolVar(&o.etcdOnly, "etcd-only", false, "serve only the embedded etcd (on the state's etcd ports), no API server")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	o.extra = fs.Args()
	if o.dir == "" {
		fs.Usage()
		fatalf(2, "--dir is required")
	}
	if o.etcdOnly && (o.etcdServers != "" || len(o.extra) > 0) {
		fatalf(2, "--etcd-only runs no API server: it takes neither --etcd-servers nor kube-apiserver flags")
	}
	if ip := net.ParseIP(o.host); ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		fatalf(2, "--host %q: give an IPv4 loopback address (127.x.y.z): the API server serves on loopback only", o.host)
	}
	if o.watchCache != "" && o.watchCache != "true" && o.watchCache != "false" {
		fatalf(2, "--watch-cache must be true or false, got %q", o.watchCache)
	}
	if o.etcdCompactionInterval != "" {
		if _, err := time.ParseDuration(o.etcdCompactionInterval); err != nil {
			fatalf(2, "--etcd-compaction-interval: %v", err)
		}
	}
	return o
}

// lockDir takes an exclusive flock on DIR/.lock (released by the kernel on any exit, SIGKILL included).
func lockDir(dir string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another podstamp-apiserver holds %s: %w", filepath.Join(dir, lockFile), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func admissionFlags(keep string) ([]string, error) {
	all := sets.New(kubeoptions.AllOrderedPlugins...)
	defaultOn := all.Difference(kubeoptions.DefaultOffAdmissionPlugins())
	enable := sets.New[string]()
	for _, p := range strings.Split(keep, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !all.Has(p) {
			return nil, fmt.Errorf("unknown admission plugin %q", p)
		}
		enable.Insert(p)
	}
	disable := defaultOn.Difference(enable)
	args := []string{}
	if enable.Len() > 0 {
		// keep the canonical order
		var ordered []string
		for _, p := range kubeoptions.AllOrderedPlugins {
			if enable.Has(p) {
				ordered = append(ordered, p)
			}
		}
		args = append(args, "--enable-admission-plugins="+strings.Join(ordered, ","))
	}
	if disable.Len() > 0 {
		d := sets.List(disable)
		sort.Strings(d)
		args = append(args, "--disable-admission-plugins="+strings.Join(d, ","))
	}
	return args, nil
}

// etcdLogLevel lets main silence etcd's "server closed" errors during a clean shutdown.
var etcdLogLevel = zap.NewAtomicLevelAt(zapcore.ErrorLevel)

func startEtcd(o options, st *state) (*embed.Etcd, error) {
	etcdLogLevel.SetLevel(logutil.ConvertToZapLevel(o.etcdLogLevel))
	zc := logutil.DefaultZapLoggerConfig
	zc.Level = etcdLogLevel
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	lg, err := zc.Build()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.Name = "podstamp-harness"
	cfg.Dir = filepath.Join(o.dir, etcdDataDir)
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", st.EtcdClientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", st.EtcdPeerPort))
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	cfg.EnableGRPCGateway = false
	cfg.Logger = "zap"
	cfg.LogLevel = o.etcdLogLevel
	cfg.LogOutputs = []string{"stderr"}
	cfg.UnsafeNoFsync = o.etcdUnsafeNoFsync
	// The apiserver does the compaction (--etcd-compaction-interval); etcd's own auto compaction stays off.
	return embed.StartEtcd(cfg)
}

func apiserverArgs(o options, st *state) ([]string, error) {
	d := o.dir
	etcdServers := fmt.Sprintf("http://127.0.0.1:%d", st.EtcdClientPort)
	if o.etcdServers != "" {
		etcdServers = o.etcdServers
	}
	args := []string{
		"--etcd-servers=" + etcdServers,
		"--bind-address=" + o.host,
		"--advertise-address=" + o.host,
		fmt.Sprintf("--secure-port=%d", st.APIServerPort),
		"--tls-cert-file=" + filepath.Join(d, servCertFile),
		"--tls-private-key-file=" + filepath.Join(d, servKeyFile),
		"--client-ca-file=" + filepath.Join(d, caCertFile),
		"--token-auth-file=" + filepath.Join(d, tokenFile),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(d, saKeyFile),
		"--service-account-signing-key-file=" + filepath.Join(d, saKeyFile),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// The "kubernetes" Endpoints cannot point at a loopback address; nothing routes to it anyway.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		fmt.Sprintf("--v=%d", o.verbosity),
	}
	adm, err := admissionFlags(o.admission)
	if err != nil {
		return nil, err
	}
	args = append(args, adm...)
	if o.etcdCompactionInterval != "" {
		args = append(args, "--etcd-compaction-interval="+o.etcdCompactionInterval)
	}
	if o.watchCache != "" {
		args = append(args, "--watch-cache="+o.watchCache)
	}
	return append(args, o.extra...), nil
}

// waitReady polls /readyz (as admin) until it answers "ok" and the system namespaces exist.
func waitReady(ctx context.Context, dir, serverURL string) error {
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %s", caCertFile)
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
	}
	get := func(path string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, serverURL+path, nil)
		req.Header.Set("Authorization", "Bearer admin-token")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, string(b)
	}
	checks := []string{"/readyz", "/api/v1/namespaces/default", "/api/v1/namespaces/kube-system"}
	for {
		ok := true
		for _, c := range checks {
			code, body := get(c)
			if code != http.StatusOK || (c == "/readyz" && strings.TrimSpace(body) != "ok") {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func main() {
	o := parseFlags()
	start := time.Now()

	dir, err := filepath.Abs(o.dir)
	if err != nil {
		fatalf(2, "--dir: %v", err)
	}
	o.dir = dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatalf(1, "create %s: %v", dir, err)
	}
	readyPath := filepath.Join(dir, readyFile)
	if err := os.Remove(readyPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		fatalf(1, "remove stale %s: %v", readyPath, err)
	}
	lock, err := lockDir(dir, 15*time.Second)
	if err != nil {
		fatalf(1, "%v", err)
	}
	defer lock.Close()
	// A previous instance may have left the ready file behind between our removal and the lock.
	os.Remove(readyPath)

	st, created, err := loadOrCreateState(dir)
	if err != nil {
		fatalf(1, "state: %v", err)
	}
	if err := ensurePKI(dir, o.host); err != nil {
		fatalf(1, "pki: %v", err)
	}
	if err := waitPortsFree(ownPorts(o, st), 10*time.Second); err != nil {
		fatalf(1, "%v", err)
	}
	if o.etcdOnly {
		os.Exit(serveEtcdOnly(o, st, readyPath))
	}
	serverURL := fmt.Sprintf("https://%s:%d", o.host, st.APIServerPort)
	if err := writeKubeconfigs(dir, serverURL); err != nil {
		fatalf(1, "kubeconfigs: %v", err)
	}
	args, err := apiserverArgs(o, st)
	if err != nil {
		fatalf(2, "%v", err)
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d (embedded)", st.EtcdClientPort)
	if o.etcdServers != "" {
		etcdURL = o.etcdServers + " (external)"
	}
	logf("dir=%s new=%v etcd=%s apiserver=%s", dir, created, etcdURL, serverURL)

	// NewAPIServerCommand installs the SIGTERM/SIGINT handler (first signal: graceful
	// shutdown via its context; second: exit 1). Create it before etcd so a signal
	// during etcd startup is honoured too.
	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(args)
	ctx := cmd.Context()

	// With an external etcd there is none of our own: etcdErr stays nil
	// (a receive from it never happens) and nothing is closed at the end.
	var etcd *embed.Etcd
	var etcdErr <-chan error
	if o.etcdServers == "" {
		etcd = waitEtcd(ctx, o, st, start)
		etcdErr = etcd.Err()
	}

	apiDone := make(chan error, 1)
	go func() { apiDone <- cli.RunNoErrOutput(cmd) }()

	readyCtx, cancelReady := context.WithTimeout(ctx, o.readyTimeout)
	defer cancelReady()
	readyErr := make(chan error, 1)
	go func() {
		if err := waitReady(readyCtx, dir, serverURL); err != nil {
			readyErr <- err
			return
		}
		line, _ := json.Marshal(struct {
			URL string `json:"url"`
			PID int    `json:"pid"`
		}{serverURL, os.Getpid()})
		line = append(line, '\n')
		if err := writeFileAtomic(readyPath, line, 0o644); err != nil {
			readyErr <- fmt.Errorf("write %s: %w", readyPath, err)
			return
		}
		os.Stdout.Write(line)
		logf("ready after %s", time.Since(start).Round(time.Millisecond))
	}()

	code := 0
	select {
	case err := <-apiDone:
		if err != nil {
			logf("kube-apiserver failed: %v", err)
			code = 1
		} else if ctx.Err() == nil {
			logf("kube-apiserver exited unexpectedly")
			code = 1
		} else {
			logf("kube-apiserver stopped")
		}
	case err := <-etcdErr:
		logf("etcd failed: %v", err)
		code = 1
	case err := <-readyErr:
		if ctx.Err() != nil { // shutting down on a signal before ready
			err = <-apiDone
			if err != nil {
				logf("kube-apiserver failed: %v", err)
				code = 1
			}
		} else {
			logf("not ready: %v", err)
			code = 1
		}
	}
	os.Remove(readyPath)
	if code != 0 {
		os.Exit(code) // don't wait for a graceful etcd close when something broke
	}
	if etcd == nil {
		logf("exiting (the external etcd %s keeps running)", o.etcdServers)
		return
	}
	etcdLogLevel.SetLevel(zapcore.FatalLevel) // Close makes every listener report "server closed"
	etcd.Close()
	logf("etcd closed, exiting")
}
