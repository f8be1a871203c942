// Command podstamp-kubecheck is podstamp's pod check: the kubelet's own
// decision on a static pod file, run by podstamp before it writes a manifest.
// It ships with podstamp (beside the binary, in the image at
// /usr/lib/podstamp/podstamp-kubecheck); it lives in the harness's Go module
// so that the Kubernetes release it speaks for is the one pinned there, the
// same release whose kubelet the tests run.
//
// What it decides, for one manifest's bytes and a node name, is what the
// kubelet's file source decides for that file (pkg/kubelet/config
// tryDecodeSinglePod with the file source's applyDefaults, v1.37.2): YAML to
// JSON, decode through legacyscheme (defaults included), the name required,
// the static-pod defaults (name "<name>-<node>", namespace, nodeName, the
// config hash annotation, the NoExecute toleration), ValidatePodCreate with
// the options the kubelet computes, conversion back to v1, and the
// static-pod rule that nothing may reference an API object. That function and
// applyDefaults are unexported, so their few lines of wiring are repeated
// here in the same order (the pod's UID, which no check reads, is hashed
// from the bytes rather than the decoded pod: see applyDefaults); every rule
// they apply is Kubernetes' own code. The
// process's capabilities are the kubelet's (privileged containers allowed).
// podstamp's differential suite (tests/fuzz.rs, tests/kubecheck.rs) holds
// this program's verdicts equal to the kubelet file source's own
// (podstamp-manifestcheck).
//
// Protocol (stdin/stdout, little-endian u32 length before every frame):
//
//	-> hello:    {"protocol":1,"kubernetes":"v1.37.2","podSecurity":"v0.37.2"}
//	<- request:  node name, NUL, the node's kubelet version (may be empty),
//	             NUL, the manifest's bytes
//	-> verdict:  {"ok":true} or {"ok":false,"error":"<the kubelet's error text>",
//	              "fields":[{"field","type","value","detail"}...]}
//	             and, for a pod it accepts, "newer":["spec.field", ...]: the
//	             fields that the node's kubelet, older than this release,
//	             would not honour (see newerFields)
//
// The Pod Security request (issue 26) shares the process: a request that
// starts with the byte 0x01 (never the start of a node name) is
//
//	<- request:  0x01, "pod-security", NUL, level, NUL, version, NUL, the
//	             manifest's bytes
//	-> verdict:  {"ok":true} or {"ok":false,"error":"violates PodSecurity
//	             \"restricted:latest\": host namespaces (hostNetwork=true), ...",
//	             "checks":[{"id","reason","detail"}...]}, or {"ok":false,
//	             "bad":"<why the request is not one>"} (the caller's fault)
//
// The combined request (a manifest about to be written that is held to a
// level needs both answers; the hello's "both":true says the helper knows
// it) decodes the manifest once and answers both questions:
//
//	<- request:  0x02, "both", NUL, node name, NUL, kubelet version, NUL,
//	             level, NUL, version, NUL, the manifest's bytes
//	-> verdict:  {"kubelet":<the kubelet verdict above>,
//	              "podSecurity":<the Pod Security verdict above>}
//
// each exactly what its own request would have answered for those bytes.
//
// Pod Security is decided by Kubernetes' own k8s.io/pod-security-admission/policy (its
// DefaultChecks, the evaluator the admission plugin builds) on the pod as
// the API server would hold it (decoded with its defaults). The hello's
// "podSecurity" is that module's version: a helper without it predates the
// request, and podstamp does not send it one.
//
// It reads requests until stdin closes. It touches no file and no network.
// Flags: --user UID (when started as root with the capability to: drop to
// that uid/gid before reading anything), --version (print the Kubernetes
// version and exit).
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/core/helper"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	k8s_api_v1 "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/capabilities"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

const (
	protocol = 1
	// The kubelet reads at most this much of a manifest file
	// (pkg/kubelet/config/common.go maxConfigLength).
	maxConfigLength = 10 * 1 << 20
	// A request is a node name and a manifest: never more than this.
	maxRequest = maxConfigLength + 1024
)

type fieldError struct {
	Field  string `json:"field"`
	Type   string `json:"type"`
	Value  string `json:"value,omitempty"`
	Detail string `json:"detail,omitempty"`
}

type verdict struct {
	OK     bool         `json:"ok"`
	Error  string       `json:"error,omitempty"`
	Fields []fieldError `json:"fields,omitempty"`
	Newer  []string     `json:"newer,omitempty"`
}

// kubernetesVersion is the k8s.io/kubernetes module this program was built from.
func kubernetesVersion() string {
	return moduleVersion("k8s.io/kubernetes")
}

// moduleVersion is the version of module path this program was built from.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == path {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "unknown"
}

// applyDefaults is the file source's (pkg/kubelet/config/common.go), for a
// file, but for how a pod without a UID gets one. The kubelet hashes the
// decoded pod (hash.DeepHashObject: go-spew printing every field, 15-30 % of
// a request's CPU here) with the file's path, which this program never knows
// (source is "podstamp"), so its UID was never the kubelet's. No check reads
// the UID's value: it is 32 hex digits (an FNV-128a sum) either way, kept in
// metadata.uid (not validated on create) and in the config hash annotation,
// whose length alone counts (the annotations' total size). So it is the same
// FNV-128a over the manifest's bytes instead of the printed pod: the same
// length, still distinct for distinct files, for a fraction of the work.
func applyDefaults(pod *api.Pod, manifest []byte, source string, nodeName types.NodeName) {
	if len(pod.UID) == 0 {
		hasher := fnv.New128a()
		hasher.Write(manifest)
		fmt.Fprintf(hasher, "host:%s", nodeName)
		fmt.Fprintf(hasher, "file:%s", source)
		pod.UID = types.UID(hex.EncodeToString(hasher.Sum(nil)[0:]))
	}
	pod.Name = fmt.Sprintf("%s-%s", pod.Name, strings.ToLower(string(nodeName)))
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.Spec.NodeName = string(nodeName)
	if pod.Annotations == nil {
		pod.Annotations = make(map[string]string)
	}
	pod.Annotations[kubetypes.ConfigHashAnnotationKey] = string(pod.UID)
	helper.AddOrUpdateTolerationInPod(pod, &api.Toleration{
		Operator: "Exists",
		Effect:   api.TaintEffectNoExecute,
	})
	pod.Status.Phase = api.PodPending
}

func fieldErrors(errs field.ErrorList) []fieldError {
	out := make([]fieldError, 0, len(errs))
	for _, e := range errs {
		fe := fieldError{Field: e.Field, Type: string(e.Type), Detail: e.Detail}
		// The same rendering of the bad value as the kubelet's message.
		if e.Type != field.ErrorTypeRequired && e.Type != field.ErrorTypeForbidden &&
			e.Type != field.ErrorTypeTooLong && e.Type != field.ErrorTypeInternal && e.BadValue != nil {
			fe.Value = badValue(e.BadValue)
		}
		out = append(out, fe)
	}
	return out
}

// badValue renders a value as field.Error.ErrorBody does, without the words around it.
func badValue(v any) string {
	body := (&field.Error{Type: field.ErrorTypeInvalid, BadValue: v}).ErrorBody()
	return strings.TrimPrefix(body, field.ErrorTypeInvalid.String()+": ")
}

// newerFields lists the fields of pod that a kubelet of version kubelet
// (older than this release) would not honour: the ones Kubernetes' own
// DropDisabledPodFields drops with the feature gates as they were in that
// release (the gates' emulation version). A field that came with a feature
// gate is unknown to the kubelets of the releases before its gate, whose
// decoder drops it without a word; every pod field added since v1.2x came
// with one. Empty for this release or a newer one, and for a version that
// does not parse (the caller says so).
func newerFields(pod *api.Pod, kubelet string) ([]string, error) {
	if kubelet == "" {
		return nil, nil
	}
	v, err := version.ParseGeneric(kubelet)
	if err != nil {
		return nil, err
	}
	current := utilfeature.DefaultFeatureGate.(featuregate.MutableVersionedFeatureGate).EmulationVersion()
	if v.Major() > current.Major() || (v.Major() == current.Major() && v.Minor() >= current.Minor()) {
		return nil, nil
	}
	gate := utilfeature.DefaultMutableFeatureGate
	if err := gate.SetEmulationVersion(version.MajorMinor(v.Major(), v.Minor())); err != nil {
		return nil, err
	}
	defer func() { _ = gate.SetEmulationVersion(current) }()
	dropped := pod.DeepCopy()
	podutil.DropDisabledPodFields(dropped, nil)
	// Most pods have nothing the older kubelet lacks: nothing dropped, so
	// the two pods' JSON, and the list, would be the same and empty. Equal
	// Go values always encode alike (the converse may not hold: a value
	// that differs only where JSON cannot tell goes the long way, to the
	// same answer), and the JSON round trips below were a third of the
	// request's CPU.
	if reflect.DeepEqual(pod, dropped) {
		return nil, nil
	}
	before, err := asJSON(pod)
	if err != nil {
		return nil, err
	}
	after, err := asJSON(dropped)
	if err != nil {
		return nil, err
	}
	var out []string
	missing("", before, after, &out)
	sort.Strings(out)
	return out, nil
}

func asJSON(pod *api.Pod) (any, error) {
	out := &v1.Pod{}
	if err := k8s_api_v1.Convert_core_Pod_To_v1_Pod(pod, out, nil); err != nil {
		return nil, err
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	var doc any
	err = json.Unmarshal(data, &doc)
	return doc, err
}

// missing appends the paths of what is in before and not (or otherwise) in after.
func missing(path string, before, after any, out *[]string) {
	switch b := before.(type) {
	case map[string]any:
		a, _ := after.(map[string]any)
		keys := make([]string, 0, len(b))
		for k := range b {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			av, ok := a[k]
			if !ok {
				*out = append(*out, p)
				continue
			}
			missing(p, b[k], av, out)
		}
	case []any:
		a, _ := after.([]any)
		for i := range b {
			p := fmt.Sprintf("%s[%d]", path, i)
			if i >= len(a) {
				*out = append(*out, p)
				continue
			}
			missing(p, b[i], a[i], out)
		}
	default:
		if fmt.Sprint(before) != fmt.Sprint(after) {
			*out = append(*out, path)
		}
	}
}

// check decides one manifest as the kubelet's file source does (tryDecodeSinglePod).
func check(node, kubelet string, data []byte) verdict {
	pod, refused := decodeManifest(data)
	if refused != nil {
		return *refused
	}
	return checkPod(pod, data, node, kubelet)
}

// decodeManifest is the first half of the kubelet's decision: the bytes to
// the internal pod, with the scheme's defaults. A manifest it refuses is
// refused with the kubelet's words.
func decodeManifest(data []byte) (*api.Pod, *verdict) {
	if len(data) > maxConfigLength {
		return nil, &verdict{Error: fmt.Sprintf("the file is %d bytes; the kubelet reads at most %d", len(data), maxConfigLength)}
	}
	js, err := utilyaml.ToJSON(data)
	if err != nil {
		return nil, &verdict{Error: err.Error()}
	}
	obj, err := runtime.Decode(legacyscheme.Codecs.UniversalDecoder(), js)
	if err != nil {
		return nil, &verdict{Error: err.Error()}
	}
	pod, ok := obj.(*api.Pod)
	if !ok {
		return nil, &verdict{Error: fmt.Sprintf("invalid pod: %#v", obj)}
	}
	return pod, nil
}

// checkPod is the rest of it, on a decoded pod (which it changes: the
// static-pod defaults) and the bytes it was decoded from.
func checkPod(pod *api.Pod, manifest []byte, node, kubelet string) verdict {
	if pod.Name == "" {
		return verdict{Error: "invalid pod: name is needed for the pod",
			Fields: []fieldError{{Field: "metadata.name", Type: string(field.ErrorTypeRequired)}}}
	}
	applyDefaults(pod, manifest, "podstamp", types.NodeName(node))
	opts := podutil.GetValidationOptionsFromPodSpecAndMeta(&pod.Spec, nil, &pod.ObjectMeta, nil)
	if errs := validation.ValidatePodCreate(pod, opts); len(errs) > 0 {
		return verdict{Error: fmt.Sprintf("invalid pod: %v", errs), Fields: fieldErrors(errs)}
	}
	out := &v1.Pod{}
	if err := k8s_api_v1.Convert_core_Pod_To_v1_Pod(pod, out, nil); err != nil {
		return verdict{Error: err.Error()}
	}
	_, resource, err := podutil.HasAPIObjectReference(pod)
	if err != nil {
		return verdict{Error: err.Error()}
	}
	if resource != "" {
		return verdict{Error: fmt.Sprintf("static pods may not reference %s", resource)}
	}
	newer, err := newerFields(pod, kubelet)
	if err != nil {
		// Not the kubelet's refusal: the kubelet version is the Node's.
		newer = []string{fmt.Sprintf("(kubelet version %q: %v)", kubelet, err)}
	}
	return verdict{OK: true, Newer: newer}
}

// decodePod reads a manifest as the API server holds a pod (decoded, its
// defaults applied), in v1, for the Pod Security checks.
func decodePod(data []byte) (*v1.Pod, error) {
	js, err := utilyaml.ToJSON(data)
	if err != nil {
		return nil, err
	}
	obj, err := runtime.Decode(legacyscheme.Codecs.UniversalDecoder(), js)
	if err != nil {
		return nil, err
	}
	pod, ok := obj.(*api.Pod)
	if !ok {
		return nil, fmt.Errorf("not a pod: %T", obj)
	}
	return toV1(pod)
}

// toV1 converts an internal pod (decoded as decodePod does) to v1.
func toV1(pod *api.Pod) (*v1.Pod, error) {
	out := &v1.Pod{}
	if err := k8s_api_v1.Convert_core_Pod_To_v1_Pod(pod, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

func writeFrame(w *bufio.Writer, payload []byte) error {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(payload)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	return w.Flush()
}

func readFrame(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxRequest {
		return nil, fmt.Errorf("a request of %d bytes, over the limit of %d", size, maxRequest)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// confine keeps the process from gaining privileges (a setuid binary it could
// not run anyway) and from opening more than a few files: it needs none.
func confine() error {
	const prSetNoNewPrivs = 38
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", errno)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 16, Max: 16}); err != nil {
		return fmt.Errorf("setrlimit(RLIMIT_NOFILE): %w", err)
	}
	return nil
}

// dropTo makes the process uid:uid with no supplementary groups (all threads).
func dropTo(uid int) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(uid); err != nil {
		return fmt.Errorf("setgid %d: %w", uid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	return nil
}

func serve(in io.Reader, out io.Writer) error {
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriterSize(out, 64<<10)
	hello, _ := json.Marshal(map[string]any{"protocol": protocol, "kubernetes": kubernetesVersion(),
		"podSecurity": moduleVersion("k8s.io/pod-security-admission"), "both": true})
	if err := writeFrame(w, hello); err != nil {
		return err
	}
	for {
		req, err := readFrame(r)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(req) > 0 && (req[0] == podSecurityMark || req[0] == bothMark) {
			var answer any
			if req[0] == podSecurityMark {
				answer = podSecurityRequest(req[1:])
			} else {
				answer = bothRequest(req[1:])
			}
			reply, err := json.Marshal(answer)
			if err != nil {
				return err
			}
			if err := writeFrame(w, reply); err != nil {
				return err
			}
			continue
		}
		node, rest, found := strings.Cut(string(req), "\x00")
		kubelet, manifest, found2 := strings.Cut(rest, "\x00")
		if !found || !found2 {
			return errors.New("a request without the NUL bytes after the node name and the kubelet version")
		}
		reply, err := json.Marshal(check(node, kubelet, []byte(manifest)))
		if err != nil {
			return err
		}
		if err := writeFrame(w, reply); err != nil {
			return err
		}
	}
}

func main() {
	user := flag.Int("user", -1, "when root, run as this uid and gid")
	version := flag.Bool("version", false, "print the Kubernetes version checked for and exit")
	flag.Parse()
	if *version {
		fmt.Println(kubernetesVersion())
		return
	}
	// The feature gates' emulation (newerFields) logs a line per gate it
	// changes: nothing a caller needs.
	klog.SetLogger(logr.Discard())
	// What the kubelet sets at its start (cmd/kubelet/app/server.go): without
	// it, ValidatePodCreate refuses every privileged container.
	capabilities.Initialize(capabilities.Capabilities{AllowPrivileged: true})
	if *user >= 0 && os.Geteuid() == 0 {
		// EPERM: root without CAP_SETUID/CAP_SETGID (a container with every
		// capability dropped, as podstamp's DaemonSet runs): it stays uid 0
		// with no capability, no new privileges and no files.
		if err := dropTo(*user); err != nil && !errors.Is(err, syscall.EPERM) {
			fmt.Fprintf(os.Stderr, "podstamp-kubecheck: %v\n", err)
			os.Exit(1)
		}
	}
	if err := buildPodSecurity(); err != nil {
		fmt.Fprintf(os.Stderr, "podstamp-kubecheck: the Pod Security checks: %v\n", err)
		os.Exit(1)
	}
	if err := confine(); err != nil {
		fmt.Fprintf(os.Stderr, "podstamp-kubecheck: %v\n", err)
		os.Exit(1)
	}
	if err := serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "podstamp-kubecheck: %v\n", err)
		os.Exit(1)
	}
}
