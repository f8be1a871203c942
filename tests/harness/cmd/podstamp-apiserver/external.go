package main

// A control plane of several API server members on one etcd, kubeadm's
// external-etcd topology: `--etcd-only` serves the embedded etcd alone (a
// process of the test, outside every node), and `--etcd-servers URL` runs
// the API server alone, on that etcd. Members that must accept each other's
// service-account tokens share the CA and the service-account key: the test
// copies ca.crt, ca.key and sa.key into each member's DIR before its first
// start (ensurePKI only makes what is missing; each member's serving
// certificate is its own, for its --host). Members that share a port (each
// on its own --host) share state.json too.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
)

// ownPorts are the addresses this process binds: an API server on an
// external etcd binds no etcd port, an etcd alone no API server port.
func ownPorts(o options, st *state) []string {
	etcd := []string{fmt.Sprintf("127.0.0.1:%d", st.EtcdClientPort), fmt.Sprintf("127.0.0.1:%d", st.EtcdPeerPort)}
	api := fmt.Sprintf("%s:%d", o.host, st.APIServerPort)
	switch {
	case o.etcdOnly:
		return etcd
	case o.etcdServers != "":
		return []string{api}
	default:
		return append(etcd, api)
	}
}

// waitEtcd starts the embedded etcd and waits until it serves; it exits
// the process when it cannot (or on a signal meanwhile: exit 0).
func waitEtcd(ctx context.Context, o options, st *state, start time.Time) *embed.Etcd {
	etcd, err := startEtcd(o, st)
	if err != nil {
		fatalf(1, "start etcd: %v", err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
		logf("etcd ready after %s", time.Since(start).Round(time.Millisecond))
	case err := <-etcd.Err():
		etcd.Close()
		fatalf(1, "etcd failed: %v", err)
	case <-ctx.Done():
		etcd.Close()
		logf("signal received during etcd startup, exiting")
		os.Exit(0)
	case <-time.After(60 * time.Second):
		etcd.Close()
		fatalf(1, "etcd not ready after 60s")
	}
	return etcd
}

// serveEtcdOnly runs the embedded etcd until SIGTERM/SIGINT (exit 0) or
// until it fails (exit 1). Ready: DIR/ready and stdout say
// {"url":"http://127.0.0.1:PORT","pid":PID}, the URL to give the members'
// --etcd-servers.
func serveEtcdOnly(o options, st *state, readyPath string) int {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	etcd := waitEtcd(ctx, o, st, start)
	line, _ := json.Marshal(struct {
		URL string `json:"url"`
		PID int    `json:"pid"`
	}{fmt.Sprintf("http://127.0.0.1:%d", st.EtcdClientPort), os.Getpid()})
	line = append(line, '\n')
	if err := writeFileAtomic(readyPath, line, 0o644); err != nil {
		etcd.Close()
		logf("write %s: %v", readyPath, err)
		return 1
	}
	os.Stdout.Write(line)
	code := 0
	select {
	case <-ctx.Done():
		logf("signal received, closing etcd")
	case err := <-etcd.Err():
		logf("etcd failed: %v", err)
		code = 1
	}
	os.Remove(readyPath)
	etcdLogLevel.SetLevel(zapcore.FatalLevel) // Close makes every listener report "server closed"
	etcd.Close()
	return code
}
