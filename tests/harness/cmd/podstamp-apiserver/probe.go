package main

// `podstamp-apiserver readyz --dir DIR`: the exec probe of a member run as
// a static pod. Members of one control plane share a PodTemplate but not a
// port (they share the host's network), and an httpGet probe's port is an
// integer a placeholder cannot fill in; the member's DIR can be (a string:
// `${node.name}` in its path), and the port is in DIR/state.json.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// probe GETs /readyz of the API server of DIR: 0 when it says ok, 1 when
// not (the reason on stdout, which the kubelet keeps as the probe's output),
// 2 on a usage error.
func probe(args []string) int {
	fs := flag.NewFlagSet("podstamp-apiserver readyz", flag.ContinueOnError)
	dir := fs.String("dir", "", "the member's state dir (required)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long the GET may take")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: podstamp-apiserver readyz --dir DIR [--timeout 2s]")
		return 2
	}
	// Read, never made: a probe of a member that never started fails.
	data, err := os.ReadFile(filepath.Join(*dir, stateFile))
	if err != nil {
		fmt.Printf("state: %v\n", err)
		return 1
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil || st.APIServerPort == 0 {
		fmt.Printf("state: %s has no apiserverPort (%v)\n", filepath.Join(*dir, stateFile), err)
		return 1
	}
	caPEM, err := os.ReadFile(filepath.Join(*dir, caCertFile))
	if err != nil {
		fmt.Printf("CA: %v\n", err)
		return 1
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		fmt.Printf("no certificate in %s\n", filepath.Join(*dir, caCertFile))
		return 1
	}
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
	}
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", st.APIServerPort))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		fmt.Printf("/readyz: %d %s\n", resp.StatusCode, body)
		return 1
	}
	return 0
}
