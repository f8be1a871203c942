//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF
//! distribution registry), on 127.0.0.1 at a free port, serving TLS with a
//! certificate of the harness CA and basic auth (a bcrypt htpasswd file),
//! its state under the test's directory.
//!
//! Needs `bash tests/harness/registry-deps.sh` (it installs the Debian
//! packages when missing and run as root). The registry is stopped by its
//! PID when the [`TestRegistry`] is dropped, whether the test passed or not;
//! it also dies with the test process (PR_SET_PDEATHSIG).
#![allow(dead_code)]

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{free_port, wait_for};

pub const USER: &str = "podstamp";
pub const PASSWORD: &str = "s3cret-test-password";

/// A running registry.
pub struct TestRegistry {
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub host: String,
    pub dir: PathBuf,
    /// The CA its certificate is signed by (the harness CA).
    pub ca: PathBuf,
}

fn run(command: &mut Command, what: &str) -> Vec<u8> {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A CA of its own, made in `dir/ca` with openssl; its directory (holding
/// `ca.crt` and `ca.key`).
pub fn own_ca(dir: &Path) -> PathBuf {
    let ca_dir = dir.join("ca");
    fs::create_dir_all(&ca_dir).unwrap();
    run(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=podstamp-test-registry-ca"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .arg("-keyout")
            .arg(ca_dir.join("ca.key"))
            .arg("-out")
            .arg(ca_dir.join("ca.crt")),
        "openssl req -x509 (the CA)",
    );
    ca_dir
}

/// A serving certificate for 127.0.0.1 signed by `ca_dir`'s CA, written to
/// `dir` (created) as `registry.crt` and `registry.key`; their paths.
pub fn serving_certificate(dir: &Path, ca_dir: &Path) -> (PathBuf, PathBuf) {
    fs::create_dir_all(dir).unwrap();
    let (ca, ca_key) = (ca_dir.join("ca.crt"), ca_dir.join("ca.key"));
    let (key, csr, cert, ext) = (
        dir.join("registry.key"),
        dir.join("registry.csr"),
        dir.join("registry.crt"),
        dir.join("registry.ext"),
    );
    run(
        Command::new("openssl")
            .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
            .args([
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/CN=podstamp-test-registry",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&csr),
        "openssl req",
    );
    fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
    )
    .unwrap();
    run(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-set_serial", "7", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(&ca)
            .arg("-CAkey")
            .arg(&ca_key)
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert),
        "openssl x509",
    );
    (cert, key)
}

impl TestRegistry {
    /// Starts a registry in `dir` (created) with a CA of its own, made in
    /// `dir/ca` with openssl: for a test or benchmark without the harness's
    /// API server (whose CA [`TestRegistry::start`] takes).
    pub fn start_with_own_ca(dir: &Path) -> TestRegistry {
        let ca_dir = own_ca(dir);
        TestRegistry::start(dir, &ca_dir)
    }

    /// Starts a registry in `dir` (created), trusting `ca_dir`'s `ca.crt` and
    /// `ca.key` (the harness API server's state directory).
    pub fn start(dir: &Path, ca_dir: &Path) -> TestRegistry {
        let deps = crate::common::repo().join("tests/harness/registry-deps.sh");
        let status = Command::new("bash").arg(&deps).status().unwrap();
        assert!(
            status.success(),
            "the test registry needs docker-registry and htpasswd: run {}",
            deps.display()
        );
        fs::create_dir_all(dir.join("data")).unwrap();
        let ca = ca_dir.join("ca.crt");
        serving_certificate(dir, ca_dir);
        let htpasswd = run(
            Command::new("htpasswd").args(["-B", "-b", "-n", USER, PASSWORD]),
            "htpasswd",
        );
        fs::write(dir.join("htpasswd"), htpasswd).unwrap();
        TestRegistry::serve(dir, &ca, free_port())
    }

    /// Starts (again) the registry of `dir` on `port`.
    fn serve(dir: &Path, ca: &Path, port: u16) -> TestRegistry {
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: info, accesslog: {{disabled: false}}}}\nstorage:\n  filesystem: {{rootdirectory: {data}}}\n  delete: {{enabled: true}}\nhttp:\n  addr: {host}\n  secret: podstamp-test-secret\n  tls: {{certificate: {dir}/registry.crt, key: {dir}/registry.key}}\nauth:\n  htpasswd: {{realm: podstamp-test, path: {dir}/htpasswd}}\n",
                data = dir.join("data").display(),
                dir = dir.display(),
            ),
        )
        .unwrap();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("registry.log"))
            .unwrap();
        let mut command = Command::new("docker-registry");
        command
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command.spawn().expect("start docker-registry");
        wait_for("the registry to listen", Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "docker-registry exited with {status}; its log:\n{}",
                    fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
                );
            }
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(|_| ())
        });
        TestRegistry {
            child: Some(child),
            host,
            dir: dir.to_path_buf(),
            ca: ca.to_path_buf(),
        }
    }

    /// A docker config JSON file for this registry, with `password`.
    pub fn docker_config(&self, path: &Path, password: &str) -> PathBuf {
        let auth = serde_json::to_value(k8s_openapi::ByteString(
            format!("{USER}:{password}").into_bytes(),
        ))
        .unwrap();
        let json = serde_json::json!({"auths": {self.host.clone(): {"auth": auth}}});
        fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
        path.to_path_buf()
    }

    /// The file holding blob `sha256:HEX` in the registry's storage.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stops the registry (SIGKILL to its PID) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}
