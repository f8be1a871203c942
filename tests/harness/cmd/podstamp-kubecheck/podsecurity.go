// The Pod Security request: Kubernetes' own Pod Security Standards
// (k8s.io/pod-security-admission/policy, the checks the PodSecurity admission
// plugin runs), for a pod the kubelet's file source would read. See the
// protocol in main.go.
//
// The verdict is the library's: the evaluator is the one the admission
// plugin builds (policy.NewEvaluator over policy.DefaultChecks), and the
// message is worded as the plugin words it (`violates PodSecurity
// "restricted:latest": <ForbiddenDetail>`). What this file adds is which
// check failed, by its ID, so that podstamp's tests can pin each check: the
// registry returns its results without IDs, so each check is also run in an
// evaluator of its own, and a baseline check counts at the restricted level
// only when the full evaluator runs it (a restricted check may override it
// for a version: removing it from the evaluator then changes nothing). The
// IDs must account for exactly the full evaluator's failures, or the
// verdict says so (never a partial list).
package main

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// podSecurityMark starts a Pod Security request, bothMark the combined
// request (a node name never starts with either).
const (
	podSecurityMark = 0x01
	bothMark        = 0x02
)

// both is the combined request's answer: each verdict as its own request
// would have given it.
type both struct {
	Kubelet     verdict            `json:"kubelet"`
	PodSecurity podSecurityVerdict `json:"podSecurity"`
}

// bothRequest answers "both", NUL, node, NUL, kubelet version, NUL, level,
// NUL, version, NUL, the manifest: one decode for the two checks. Pod
// Security is decided first, on the pod as decoded (as decodePod has it),
// since the kubelet's check then changes the pod (the static-pod defaults).
func bothRequest(req []byte) both {
	parts := strings.SplitN(string(req), "\x00", 6)
	if len(parts) != 6 || parts[0] != "both" {
		bad := "a combined request is \"both\", node, kubelet version, level, version and the manifest, NUL between them"
		return both{Kubelet: verdict{Error: bad}, PodSecurity: podSecurityVerdict{Bad: bad}}
	}
	node, kubelet := parts[1], parts[2]
	lv, bad := levelVersion(parts[3], parts[4])
	manifest := []byte(parts[5])
	pod, refused := decodeManifest(manifest)
	if refused != nil {
		if bad == "" {
			bad = "the manifest is not a pod: " + refused.Error
		}
		return both{Kubelet: *refused, PodSecurity: podSecurityVerdict{Bad: bad}}
	}
	var security podSecurityVerdict
	if bad != "" {
		security = podSecurityVerdict{Bad: bad}
	} else if v1pod, err := toV1(pod); err != nil {
		security = podSecurityVerdict{Bad: fmt.Sprintf("the manifest is not a pod: %v", err)}
	} else {
		security = evaluate(lv, v1pod)
	}
	return both{Kubelet: checkPod(pod, manifest, node, kubelet), PodSecurity: security}
}

// levelVersion parses a request's level and version; bad says why not.
func levelVersion(levelText, versionText string) (lv psaapi.LevelVersion, bad string) {
	level, err := psaapi.ParseLevel(levelText)
	if err != nil {
		return lv, fmt.Sprintf("level %q: %v", levelText, err)
	}
	version, err := psaapi.ParseVersion(versionText)
	if err != nil {
		return lv, fmt.Sprintf("version %q: %v", versionText, err)
	}
	return psaapi.LevelVersion{Level: level, Version: version}, ""
}

type failedCheck struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

type podSecurityVerdict struct {
	OK     bool          `json:"ok"`
	Error  string        `json:"error,omitempty"`
	Checks []failedCheck `json:"checks,omitempty"`
	// The request itself was wrong (an unknown level or version, a manifest
	// that is no pod): not a verdict on the pod.
	Bad string `json:"bad,omitempty"`
}

type oneCheck struct {
	id    string
	level psaapi.Level
	// alone runs only this check; without runs every check but this one.
	alone, without policy.Evaluator
}

var (
	fullEvaluator policy.Evaluator
	eachCheck     []oneCheck
)

// buildPodSecurity builds the evaluators once, before any request.
func buildPodSecurity() error {
	checks := policy.DefaultChecks()
	full, err := policy.NewEvaluator(checks, nil)
	if err != nil {
		return err
	}
	fullEvaluator = full
	for i, c := range checks {
		alone, err := policy.NewEvaluator([]policy.Check{c}, nil)
		if err != nil {
			return fmt.Errorf("check %s: %w", c.ID, err)
		}
		rest := make([]policy.Check, 0, len(checks)-1)
		rest = append(rest, checks[:i]...)
		rest = append(rest, checks[i+1:]...)
		without, err := policy.NewEvaluator(rest, nil)
		if err != nil {
			return fmt.Errorf("without check %s: %w", c.ID, err)
		}
		eachCheck = append(eachCheck, oneCheck{id: string(c.ID), level: c.Level, alone: alone, without: without})
	}
	// The registry's order (policy/registry.go populate): baseline checks
	// first, then restricted ones, each by ID.
	rank := func(l psaapi.Level) int {
		if l == psaapi.LevelBaseline {
			return 0
		}
		return 1
	}
	slices.SortFunc(eachCheck, func(a, b oneCheck) int {
		return cmp.Or(cmp.Compare(rank(a.level), rank(b.level)), cmp.Compare(a.id, b.id))
	})
	return nil
}

// podSecurityRequest answers one request: "pod-security", NUL, level, NUL,
// version, NUL, the manifest.
func podSecurityRequest(req []byte) podSecurityVerdict {
	parts := strings.SplitN(string(req), "\x00", 4)
	if len(parts) != 4 || parts[0] != "pod-security" {
		return podSecurityVerdict{Bad: "a Pod Security request is \"pod-security\", level, version and the manifest, NUL between them"}
	}
	lv, bad := levelVersion(parts[1], parts[2])
	if bad != "" {
		return podSecurityVerdict{Bad: bad}
	}
	pod, err := decodePod([]byte(parts[3]))
	if err != nil {
		return podSecurityVerdict{Bad: fmt.Sprintf("the manifest is not a pod: %v", err)}
	}
	return evaluate(lv, pod)
}

// evaluate decides one pod at one level and version.
func evaluate(lv psaapi.LevelVersion, pod *v1.Pod) podSecurityVerdict {
	level := lv.Level
	results := fullEvaluator.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec)
	aggregate := policy.AggregateCheckResults(results)
	if aggregate.Allowed {
		return podSecurityVerdict{OK: true}
	}
	var failed []failedCheck
	for _, c := range eachCheck {
		alone := c.alone.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec)
		if len(alone) != 1 || alone[0].Allowed {
			continue // not run at this level and version, or passed
		}
		if c.level == psaapi.LevelBaseline && level == psaapi.LevelRestricted &&
			len(c.without.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec)) == len(results) {
			continue // overridden by a restricted check at this version
		}
		failed = append(failed, failedCheck{ID: c.id, Reason: alone[0].ForbiddenReason, Detail: alone[0].ForbiddenDetail})
	}
	message := fmt.Sprintf("violates PodSecurity %q: %s", lv.String(), aggregate.ForbiddenDetail())
	if err := sameFailures(failed, aggregate); err != nil {
		return podSecurityVerdict{Bad: fmt.Sprintf("%s (%v)", message, err)}
	}
	return podSecurityVerdict{Error: message, Checks: failed}
}

// sameFailures holds the IDs found to the library's own list of failures.
func sameFailures(failed []failedCheck, aggregate policy.AggregateCheckResult) error {
	if len(failed) != len(aggregate.ForbiddenReasons) {
		return fmt.Errorf("%d checks failed, but %d were told apart by their IDs", len(aggregate.ForbiddenReasons), len(failed))
	}
	for i, f := range failed {
		if f.Reason != aggregate.ForbiddenReasons[i] || f.Detail != aggregate.ForbiddenDetails[i] {
			return errors.New("the checks told apart do not match the evaluator's")
		}
	}
	return nil
}
