// The helper's cost per request, by part, on the bytes podstamp sends: a
// benchmark of serve() itself (the framing, the decision, the verdict's
// JSON) for each request shape, and of the parts a request is made of, so
// that `go test -bench . -cpuprofile` names where a request's CPU goes
// (docs/performance.md 14.3). It decides nothing and asserts only that each
// request is answered as the bench expects (a benchmark of a refusal would
// measure the wrong path).
//
//	cd tests/harness && GOMAXPROCS=1 go test -run '^$' -bench . -benchmem \
//	  -cpuprofile /tmp/kc.prof -o /tmp/kc.test ./cmd/podstamp-kubecheck
//	go tool pprof -top /tmp/kc.prof
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/capabilities"
	psaapi "k8s.io/pod-security-admission/api"
	"sigs.k8s.io/yaml"
)

var setup = sync.OnceValues(func() ([]byte, error) {
	// What main does before serving.
	klog.SetLogger(logr.Discard())
	capabilities.Initialize(capabilities.Capabilities{AllowPrivileged: true})
	if err := buildPodSecurity(); err != nil {
		return nil, err
	}
	// The full-field fixture as podstamp would write it: YAML, a Pod named
	// "full" with the fixture's spec (kubecheck.py sends the same as JSON).
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "fixtures", "kubecheck", "full.yaml"))
	if err != nil {
		return nil, err
	}
	var template struct {
		Template struct {
			Spec json.RawMessage `json:"spec"`
		} `json:"template"`
	}
	if err := yaml.Unmarshal(data, &template); err != nil {
		return nil, err
	}
	var spec any
	if err := json.Unmarshal(template.Template.Spec, &spec); err != nil {
		return nil, err
	}
	return yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "full"}, "spec": spec})
})

func manifests(b *testing.B) map[string][]byte {
	full, err := setup()
	if err != nil {
		b.Fatal(err)
	}
	small, err := os.ReadFile(filepath.Join("..", "..", "..", "fixtures", "kubecheck", "small.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	// small is the small pod of tests/bench/kubecheck.py too (581 B).
	return map[string][]byte{"small": small, "full": full}
}

func frame(payload []byte) []byte {
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	return append(out, payload...)
}

func kubeletRequest(kubelet string, manifest []byte) []byte {
	return append([]byte("n1\x00"+kubelet+"\x00"), manifest...)
}

func bothRequestBytes(level string, manifest []byte) []byte {
	return append([]byte("\x02both\x00n1\x00\x00"+level+"\x00latest\x00"), manifest...)
}

// verdicts reads serve's output: the hello, then one frame a request.
func verdicts(b *testing.B, out []byte) []json.RawMessage {
	r := bufio.NewReader(bytes.NewReader(out))
	var all []json.RawMessage
	for {
		f, err := readFrame(r)
		if err == io.EOF {
			return all[1:]
		}
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, f)
	}
}

// BenchmarkServe is a request end to end as the helper answers it: read
// from its input, decided, the verdict encoded and written.
func BenchmarkServe(b *testing.B) {
	ms := manifests(b)
	for _, c := range []struct {
		name string
		req  func() []byte
		want string
	}{
		{"kubelet/small", func() []byte { return kubeletRequest("", ms["small"]) }, `{"ok":true}`},
		{"kubelet/full", func() []byte { return kubeletRequest("", ms["full"]) }, `{"ok":true}`},
		{"kubelet-v1.34/small", func() []byte { return kubeletRequest("v1.34.0", ms["small"]) }, `{"ok":true}`},
		{"kubelet-v1.34/full", func() []byte { return kubeletRequest("v1.34.0", ms["full"]) }, ""},
		{"both-restricted/small", func() []byte { return bothRequestBytes("restricted", ms["small"]) }, ""},
		{"both-baseline/full", func() []byte { return bothRequestBytes("baseline", ms["full"]) }, ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			one := frame(c.req())
			in := bytes.Repeat(one, b.N)
			var out bytes.Buffer
			b.SetBytes(int64(len(one)))
			b.ResetTimer()
			if err := serve(bytes.NewReader(in), &out); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			got := verdicts(b, out.Bytes())
			if len(got) != b.N {
				b.Fatalf("%d verdicts for %d requests", len(got), b.N)
			}
			if c.want != "" && string(got[0]) != c.want {
				b.Fatalf("verdict %s, want %s", got[0], c.want)
			}
		})
	}
}

// BenchmarkParts is each step of a combined request on its own, on the
// full-field pod.
func BenchmarkParts(b *testing.B) {
	full := manifests(b)["full"]
	lv, bad := levelVersion("baseline", "latest")
	if bad != "" {
		b.Fatal(bad)
	}
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, refused := decodeManifest(full); refused != nil {
				b.Fatal(refused.Error)
			}
		}
	})
	b.Run("checkPod", func(b *testing.B) {
		pod, _ := decodeManifest(full)
		for b.Loop() {
			b.StopTimer()
			p := pod.DeepCopy()
			b.StartTimer()
			if v := checkPod(p, full, "n1", ""); !v.OK {
				b.Fatal(v.Error)
			}
		}
	})
	b.Run("toV1+evaluate", func(b *testing.B) {
		pod, _ := decodeManifest(full)
		for b.Loop() {
			v1pod, err := toV1(pod)
			if err != nil {
				b.Fatal(err)
			}
			_ = evaluate(lv, v1pod)
		}
	})
	b.Run("verdict-json", func(b *testing.B) {
		pod, _ := decodeManifest(full)
		v1pod, _ := toV1(pod)
		answer := both{Kubelet: verdict{OK: true}, PodSecurity: evaluate(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, v1pod)}
		for b.Loop() {
			if _, err := json.Marshal(answer); err != nil {
				b.Fatal(err)
			}
		}
	})
}
