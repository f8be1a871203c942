// Command podstamp-manifestcheck runs the kubelet's own static-pod file source
// (k8s.io/kubernetes/pkg/kubelet/config: NewPodConfig + NewSourceFile, exactly
// as pkg/kubelet wires it for --pod-manifest-path) over manifest files or
// directories and reports, per file, whether the kubelet accepts it.
//
// Usage: podstamp-manifestcheck [--node-name N] [--verbose] PATH...
//
// Output: one JSON line per file examined:
//
//	{"file":"...","ok":true,"pod":"name","namespace":"ns","kubeletName":"name-node","uid":"..."}
//	{"file":"...","ok":false,"error":"..."}
//
// Exit: 0 all accepted, 1 any rejected (or a PATH missing), 2 usage error,
// 3 harness internal error (timeout, or kubelet/harness disagreement).
//
// How the per-file verdict is obtained: each file is fed alone to a kubelet
// file source (the kubelet's extractFromFile -> tryDecodeSinglePod path); the
// kubelet either emits the pod as an ADD update or logs the decode/validation
// error, which is captured through the logr.Logger handed to the kubelet code.
// For a directory PATH, the directory itself is additionally fed to a kubelet
// file source (the kubelet's own listing: it skips dot-files and
// subdirectories) and the result is cross-checked: a file is ok only if the
// kubelet's directory source also delivered its pod (matched by the UID the
// kubelet derives from pod content + node + file path), which also catches
// pods the kubelet drops for duplicate names.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/capabilities"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
)

const (
	exitOK       = 0
	exitRejected = 1
	exitUsage    = 2
	exitInternal = 3

	// Each kubelet file source holds one inotify instance for the life of the
	// process (it cannot be stopped); checking files in child processes of at
	// most this many keeps us well below fs.inotify.max_user_instances (128).
	filesPerProcess = 32
	waitTimeout     = 30 * time.Second
	// Long enough that the periodic re-list never fires during a check.
	listPeriod = 24 * time.Hour
)

var verbose bool

// ---- capturing logr sink: the kubelet code reports per-file errors only via its logger ----

type logEntry struct {
	isError bool
	msg     string
	err     error
	kv      []any
}

type capture struct {
	mu      sync.Mutex
	entries []logEntry
	notify  chan struct{}
}

func newCapture() *capture { return &capture{notify: make(chan struct{}, 1)} }

func (c *capture) add(e logEntry) {
	c.mu.Lock()
	c.entries = append(c.entries, e)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	if verbose {
		s := e.msg
		if e.err != nil {
			s += ": " + e.err.Error()
		}
		fmt.Fprintf(os.Stderr, "kubelet-config: %s %v\n", s, e.kv)
	}
}

func (c *capture) snapshot() []logEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]logEntry(nil), c.entries...)
}

type sink struct {
	c  *capture
	kv []any
}

func (s *sink) Init(logr.RuntimeInfo)  {}
func (s *sink) Enabled(level int) bool { return level == 0 || verbose }
func (s *sink) Info(level int, msg string, kv ...any) {
	s.c.add(logEntry{msg: msg, kv: append(append([]any(nil), s.kv...), kv...)})
}
func (s *sink) Error(err error, msg string, kv ...any) {
	s.c.add(logEntry{isError: true, msg: msg, err: err, kv: append(append([]any(nil), s.kv...), kv...)})
}
func (s *sink) WithValues(kv ...any) logr.LogSink {
	return &sink{c: s.c, kv: append(append([]any(nil), s.kv...), kv...)}
}
func (s *sink) WithName(string) logr.LogSink { return s }

func kvString(kv []any, key string) (string, bool) {
	for i := 0; i+1 < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok && k == key {
			switch v := kv[i+1].(type) {
			case string:
				return v, true
			case fmt.Stringer:
				return v.String(), true
			}
		}
	}
	return "", false
}

// ---- event recorder: PodConfig reports pods it drops (duplicate names) as events ----

type event struct {
	uid     types.UID
	message string
}

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) record(obj runtime.Object, eventtype, reason, msg string) {
	var uid types.UID
	if p, ok := obj.(*v1.Pod); ok {
		uid = p.UID
	}
	r.mu.Lock()
	r.events = append(r.events, event{uid: uid, message: fmt.Sprintf("%s %s: %s", eventtype, reason, msg)})
	r.mu.Unlock()
}
func (r *recorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.record(obj, eventtype, reason, message)
}
func (r *recorder) Eventf(obj runtime.Object, eventtype, reason, f string, args ...any) {
	r.record(obj, eventtype, reason, fmt.Sprintf(f, args...))
}
func (r *recorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, f string, args ...any) {
	r.record(obj, eventtype, reason, fmt.Sprintf(f, args...))
}
func (r *recorder) WithLogger(klog.Logger) record.EventRecorderLogger { return r }

func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

type noopSLI struct{}

func (noopSLI) ObservedPodOnWatch(klog.Logger, *v1.Pod, time.Time) {}

// ---- running a kubelet file source ----

type sourceRun struct {
	capture  *capture
	recorder *recorder
	updates  <-chan kubetypes.PodUpdate
}

// startSource wires a kubelet file source the way pkg/kubelet does for the static pod path.
func startSource(path, node string) *sourceRun {
	c := newCapture()
	logger := logr.New(&sink{c: c})
	ctx := klog.NewContext(context.Background(), logger)
	rec := &recorder{}
	cfg := config.NewPodConfig(rec, noopSLI{})
	config.NewSourceFile(logger, path, types.NodeName(node), listPeriod, cfg.Channel(ctx, kubetypes.FileSource))
	return &sourceRun{capture: c, recorder: rec, updates: cfg.Updates()}
}

// isWatchError tells errors of the source's inotify watcher goroutine (which shares the
// "Unable to read config path" message with the listing) apart from listing errors.
func isWatchError(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.HasPrefix(s, "unable to create inotify") || strings.HasPrefix(s, "error while watching") ||
		strings.HasPrefix(s, "error while processing inotify event")
}

type fileResult struct {
	File        string `json:"file"`
	OK          bool   `json:"ok"`
	Pod         string `json:"pod,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	KubeletName string `json:"kubeletName,omitempty"`
	UID         string `json:"uid,omitempty"`
	Error       string `json:"error,omitempty"`
	internal    bool
}

func podResult(file, node string, p *v1.Pod) fileResult {
	name := strings.TrimSuffix(p.Name, "-"+strings.ToLower(node)) // the kubelet appends "-<node>"
	return fileResult{File: file, OK: true, Pod: name, Namespace: p.Namespace, KubeletName: p.Name, UID: string(p.UID)}
}

// checkFile feeds one regular file to its own kubelet file source.
func checkFile(path, node string) fileResult {
	run := startSource(path, node)
	deadline := time.After(waitTimeout)
	for {
		select {
		case u := <-run.updates:
			if len(u.Pods) == 1 {
				return podResult(path, node, u.Pods[0])
			}
			// An empty SET for a single file is only sent when the path vanished.
			if len(u.Pods) == 0 {
				return fileResult{File: path, Error: "kubelet file source reported no pod (file removed during check?)"}
			}
			return fileResult{File: path, Error: fmt.Sprintf("internal: %d pods from one file", len(u.Pods)), internal: true}
		case <-run.capture.notify:
			for _, e := range run.capture.snapshot() {
				if e.isError && !isWatchError(e.err) {
					msg := e.msg
					if e.err != nil {
						msg = e.err.Error()
					}
					return fileResult{File: path, Error: msg}
				}
			}
		case <-deadline:
			return fileResult{File: path, Error: "internal: timeout waiting for the kubelet file source", internal: true}
		}
	}
}

// checkFiles checks files, in child processes when there are many (see filesPerProcess).
func checkFiles(files []string, node string) []fileResult {
	if len(files) <= filesPerProcess {
		var out []fileResult
		for _, f := range files {
			out = append(out, checkFile(f, node))
		}
		return out
	}
	self, err := os.Executable()
	var out []fileResult
	for i := 0; i < len(files); i += filesPerProcess {
		chunk := files[i:min(i+filesPerProcess, len(files))]
		if err == nil {
			var res []fileResult
			res, err = checkFilesChild(self, chunk, node)
			out = append(out, res...)
		}
		if err != nil {
			for _, f := range chunk {
				out = append(out, fileResult{File: f, Error: "internal: " + err.Error(), internal: true})
			}
		}
	}
	return out
}

func checkFilesChild(self string, files []string, node string) ([]fileResult, error) {
	args := []string{"--internal-files", "--node-name", node}
	if verbose {
		args = append(args, "--verbose")
	}
	cmd := exec.Command(self, append(append(args, "--"), files...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.Output()
	if err != nil && !isExitCode(err, exitRejected) {
		return nil, fmt.Errorf("child check: %w", err)
	}
	var res []fileResult
	sc := bufio.NewScanner(strings.NewReader(string(stdout)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r fileResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("child output: %w", err)
		}
		r.internal = strings.HasPrefix(r.Error, "internal:")
		res = append(res, r)
	}
	if len(res) != len(files) {
		return nil, fmt.Errorf("child returned %d results for %d files", len(res), len(files))
	}
	return res, nil
}

func isExitCode(err error, code int) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == code
}

// listDir lists the files the kubelet's directory source reads: extractFromDir globs
// "[^.]*" (dot-files are ignored), sorts, stats (following symlinks) and reads only
// regular files, never recursing into directories.
func listDir(dir string) (files, skipped []string, statErrs map[string]error, err error) {
	ents, err := filepath.Glob(filepath.Join(dir, "[^.]*"))
	if err != nil {
		return nil, nil, nil, err
	}
	sort.Strings(ents)
	statErrs = map[string]error{}
	for _, p := range ents {
		st, err := os.Stat(p)
		switch {
		case err != nil: // e.g. a dangling symlink: the kubelet logs it and skips it
			statErrs[p] = err
		case !st.Mode().IsRegular():
			skipped = append(skipped, p)
		default:
			files = append(files, p)
		}
	}
	return files, skipped, statErrs, nil
}

// checkDir checks each file, then runs the kubelet's directory source and cross-checks.
func checkDir(dir, node string) []fileResult {
	dir = strings.TrimRight(dir, string(os.PathSeparator)) // as NewSourceFile does
	if dir == "" {
		dir = "/"
	}
	files, skipped, statErrs, err := listDir(dir)
	if err != nil {
		return []fileResult{{File: dir, Error: "internal: " + err.Error(), internal: true}}
	}
	for _, s := range skipped {
		fmt.Fprintf(os.Stderr, "podstamp-manifestcheck: %s: not a regular file, the kubelet does not read it\n", s)
	}
	results := checkFiles(files, node)
	for p, err := range statErrs {
		results = append(results, fileResult{File: p, Error: "Could not get metadata: " + err.Error()})
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].File < results[j].File })

	run := startSource(dir, node)
	var dirPods []*v1.Pod
	select {
	case u := <-run.updates:
		dirPods = u.Pods
	case <-time.After(waitTimeout):
		return append(results, fileResult{File: dir, Error: "internal: timeout waiting for the kubelet directory source", internal: true})
	}
	accepted := map[string]*v1.Pod{}
	for _, p := range dirPods {
		accepted[string(p.UID)] = p
	}
	dropped := map[string]string{}
	for _, ev := range run.recorder.snapshot() {
		dropped[string(ev.uid)] = ev.message
	}
	dirErrs := map[string]string{}
	for _, e := range run.capture.snapshot() {
		if !e.isError || isWatchError(e.err) {
			continue
		}
		p, hasPath := kvString(e.kv, "path")
		switch {
		case hasPath && p != dir && e.err != nil:
			// "Could not process manifest file" / "Could not get metadata"
			dirErrs[p] = e.err.Error()
		case hasPath && p != dir:
			// subdirectory or special file: skipped by the kubelet, as by listDir
		default:
			msg := e.msg
			if e.err != nil {
				msg += ": " + e.err.Error()
			}
			return append(results, fileResult{File: dir, Error: msg})
		}
	}
	// The kubelet's file source keys its store by namespace/name, so of several files
	// defining the same pod only one survives; remember which file that was.
	deliveredFile := map[string]string{}
	for _, r := range results {
		if p, ok := accepted[r.UID]; ok && r.OK {
			deliveredFile[p.Namespace+"/"+p.Name] = r.File
		}
	}
	matched := 0
	known := map[string]bool{}
	for i := range results {
		r := &results[i]
		known[r.File] = true
		if r.internal {
			continue
		}
		if r.OK {
			if _, ok := accepted[r.UID]; ok {
				matched++
			} else if msg, ok := dropped[r.UID]; ok {
				*r = fileResult{File: r.File, Error: "dropped by the kubelet's pod config: " + msg}
			} else if other, ok := deliveredFile[r.Namespace+"/"+r.KubeletName]; ok {
				*r = fileResult{File: r.File, Error: fmt.Sprintf("duplicate pod %s/%s: the kubelet's file source keeps only the one from %s", r.Namespace, r.KubeletName, other)}
			} else {
				*r = fileResult{File: r.File, Error: "internal: accepted alone but not delivered by the kubelet's directory source", internal: true}
			}
		} else if _, ok := dirErrs[r.File]; !ok {
			*r = fileResult{File: r.File, Error: "internal: rejected alone but not reported by the kubelet's directory source: " + r.Error, internal: true}
		}
	}
	if matched != len(dirPods) {
		results = append(results, fileResult{File: dir, internal: true,
			Error: fmt.Sprintf("internal: the kubelet's directory source delivered %d pods, harness matched %d", len(dirPods), matched)})
	}
	for p := range dirErrs {
		if !known[p] {
			results = append(results, fileResult{File: p, internal: true, Error: "internal: the kubelet read a file the harness did not list: " + dirErrs[p]})
		}
	}
	return results
}

func main() {
	fs := flag.NewFlagSet("podstamp-manifestcheck", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	node := fs.String("node-name", "podstamp-node", "node name the kubelet would use (it names static pods NAME-NODE)")
	fs.BoolVar(&verbose, "verbose", false, "print the kubelet code's log messages to stderr")
	internalFiles := fs.Bool("internal-files", false, "internal: check only the given regular files (used for child processes)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: podstamp-manifestcheck [--node-name N] [--verbose] PATH...\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(exitOK)
		}
		os.Exit(exitUsage)
	}
	paths := fs.Args()
	if len(paths) == 0 || *node == "" {
		fs.Usage()
		os.Exit(exitUsage)
	}
	// What the kubelet sets at its start (cmd/kubelet/app/server.go), before its
	// file source runs: without it, ValidatePodCreate refuses every privileged
	// container, which the real kubelet runs.
	capabilities.Initialize(capabilities.Capabilities{AllowPrivileged: true})
	// The kubelet code logs through klog in a few places that do not take our logger.
	klog.SetLogger(logr.New(&sink{c: newCapture()}))

	var results []fileResult
	if *internalFiles {
		for _, p := range paths {
			results = append(results, checkFile(p, *node))
		}
	} else {
		for _, p := range paths {
			st, err := os.Stat(p)
			switch {
			case err != nil:
				results = append(results, fileResult{File: p, Error: err.Error()})
			case st.IsDir():
				results = append(results, checkDir(p, *node)...)
			case st.Mode().IsRegular():
				results = append(results, checkFiles([]string{strings.TrimRight(p, string(os.PathSeparator))}, *node)...)
			default:
				results = append(results, fileResult{File: p, Error: "path is not a directory or file"})
			}
		}
	}
	code := exitOK
	w := bufio.NewWriter(os.Stdout)
	for _, r := range results {
		line, _ := json.Marshal(r)
		w.Write(append(line, '\n'))
		if r.internal {
			code = exitInternal
		} else if !r.OK && code == exitOK {
			code = exitRejected
		}
	}
	w.Flush()
	os.Exit(code)
}
