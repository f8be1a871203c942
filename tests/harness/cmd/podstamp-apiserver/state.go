package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Files inside the state dir.
const (
	stateFile     = "state.json"
	caCertFile    = "ca.crt"
	caKeyFile     = "ca.key"
	servCertFile  = "apiserver.crt"
	servKeyFile   = "apiserver.key"
	saKeyFile     = "sa.key"
	tokenFile     = "tokens.csv"
	etcdDataDir   = "etcd"
	readyFile     = "ready"
	lockFile      = ".lock"
	stateVersion1 = 1
)

// state is persisted in DIR/state.json on first start and reused afterwards.
type state struct {
	Version        int `json:"version"`
	EtcdClientPort int `json:"etcdClientPort"`
	EtcdPeerPort   int `json:"etcdPeerPort"`
	APIServerPort  int `json:"apiserverPort"`
}

// user is one entry of the static token file (and one kubeconfig).
type user struct {
	token, name, uid string
	groups           []string
	kubeconfig       string
}

var users = []user{
	{token: "admin-token", name: "admin", uid: "admin", groups: []string{"system:masters"}, kubeconfig: "admin.kubeconfig"},
	{token: "podstamp-token", name: "podstamp", uid: "podstamp", groups: []string{"system:authenticated"}, kubeconfig: "podstamp.kubeconfig"},
	{token: "nobody-token", name: "nobody", uid: "nobody", kubeconfig: "nobody.kubeconfig"},
}

// writeFileAtomic writes data to a temp file in the same dir, fsyncs it and renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1 (listen on :0, then release).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitPortsFree waits until every address (host:port) can be bound (a previous instance may
// still be exiting), or fails after timeout with a clear message.
func waitPortsFree(addrs []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var busy error
		for _, a := range addrs {
			l, err := net.Listen("tcp", a)
			if err != nil {
				busy = fmt.Errorf("%s (its port saved in %s) is in use: %w", a, stateFile, err)
				break
			}
			l.Close()
		}
		if busy == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return busy
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// loadOrCreateState returns the saved state or creates (and saves) a new one with fresh ports.
func loadOrCreateState(dir string) (*state, bool, error) {
	p := filepath.Join(dir, stateFile)
	data, err := os.ReadFile(p)
	if err == nil {
		var s state
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, false, fmt.Errorf("parse %s: %w", p, err)
		}
		if s.EtcdClientPort == 0 || s.EtcdPeerPort == 0 || s.APIServerPort == 0 {
			return nil, false, fmt.Errorf("%s is incomplete: %s", p, data)
		}
		return &s, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, false, fmt.Errorf("pick free ports: %w", err)
	}
	s := &state{Version: stateVersion1, EtcdClientPort: ports[0], EtcdPeerPort: ports[1], APIServerPort: ports[2]}
	out, _ := json.MarshalIndent(s, "", "  ")
	if err := writeFileAtomic(p, append(out, '\n'), 0o644); err != nil {
		return nil, false, err
	}
	return s, true, nil
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("bad PEM in %s or %s", caCertFile, caKeyFile)
	}
	c, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return c, k, nil
}

// certifies tells whether the serving certificate in dir names host (a
// member moved to another --host needs a new one).
func certifies(dir, host string) bool {
	data, err := os.ReadFile(filepath.Join(dir, servCertFile))
	if err != nil {
		return false
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return false
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return false
	}
	return c.VerifyHostname(host) == nil
}

// ensurePKI creates (only if missing) the CA, the CA-signed serving cert (for host too), the SA key
// and the token file.
func ensurePKI(dir, host string) error {
	now := time.Now()
	if !fileExists(filepath.Join(dir, caCertFile)) || !fileExists(filepath.Join(dir, caKeyFile)) {
		k, keyPEM, err := newKey()
		if err != nil {
			return err
		}
		sn, err := serial()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          sn,
			Subject:               pkix.Name{CommonName: "podstamp-harness-ca"},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, caCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return err
		}
		// A new CA invalidates any old serving cert.
		os.Remove(filepath.Join(dir, servCertFile))
	}
	if !certifies(dir, host) || !fileExists(filepath.Join(dir, servKeyFile)) {
		ca, caKey, err := loadCA(dir)
		if err != nil {
			return err
		}
		k, keyPEM, err := newKey()
		if err != nil {
			return err
		}
		sn, err := serial()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          sn,
			Subject:               pkix.Name{CommonName: "kube-apiserver"},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			BasicConstraintsValid: true,
			IsCA:                  false,
			DNSNames:              []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			IPAddresses:           sans(host),
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, servKeyFile), keyPEM, 0o600); err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, servCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return err
		}
	}
	if !fileExists(filepath.Join(dir, saKeyFile)) {
		_, keyPEM, err := newKey()
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, saKeyFile), keyPEM, 0o600); err != nil {
			return err
		}
	}
	// The token file is fully determined by the users table: always rewrite it.
	var csv []byte
	for _, u := range users {
		line := fmt.Sprintf("%s,%s,%s", u.token, u.name, u.uid)
		if len(u.groups) > 0 {
			line += `,"`
			for i, g := range u.groups {
				if i > 0 {
					line += ","
				}
				line += g
			}
			line += `"`
		}
		csv = append(csv, line+"\n"...)
	}
	return writeFileAtomic(filepath.Join(dir, tokenFile), csv, 0o600)
}

// writeKubeconfigs writes one kubeconfig per user (token auth, CA embedded), atomically.
func writeKubeconfigs(dir, serverURL string) error {
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return err
	}
	for _, u := range users {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["podstamp-harness"] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: caPEM}
		cfg.AuthInfos[u.name] = &clientcmdapi.AuthInfo{Token: u.token}
		cfg.Contexts[u.name] = &clientcmdapi.Context{Cluster: "podstamp-harness", AuthInfo: u.name, Namespace: "default"}
		cfg.CurrentContext = u.name
		data, err := clientcmd.Write(*cfg)
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, u.kubeconfig), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// sans are the serving certificate's IP addresses: loopback, and host.
func sans(host string) []net.IP {
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	if host != "127.0.0.1" {
		ips = append(ips, net.ParseIP(host))
	}
	return ips
}
