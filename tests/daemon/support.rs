//! Helpers for the daemon's end-to-end tests: the harness's real
//! kube-apiserver, `podstamp run` processes, the kubelet's manifest check.
#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::repo;
#[allow(unused_imports)] // each test file uses some of them
pub use crate::common::{harness_bin, kubelet_accepts};

/// Polls `probe` every 50 ms until it gives a value, for at most `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Makes the child die with the thread that spawned it.
fn die_with_parent(command: &mut Command) {
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A `podstamp-apiserver` process on a state directory.
pub struct ApiServer {
    pub dir: PathBuf,
    child: Option<Child>,
    pub url: String,
}

impl ApiServer {
    /// Starts (or restarts, on the same directory) a server and waits until it is ready.
    pub fn start(dir: &Path) -> ApiServer {
        ApiServer::start_with(dir, &[])
    }

    /// [`ApiServer::start`] with extra podstamp-apiserver flags.
    pub fn start_with(dir: &Path, flags: &[&str]) -> ApiServer {
        fs::create_dir_all(dir).unwrap();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("apiserver.log"))
            .unwrap();
        let mut command = Command::new(harness_bin("podstamp-apiserver"));
        command
            .arg("--dir")
            .arg(dir)
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_parent(&mut command);
        let mut child = command.spawn().expect("start podstamp-apiserver");
        let pid = child.id();
        let ready = dir.join("ready");
        let url = wait_for(
            "the API server's ready file",
            Duration::from_secs(90),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "podstamp-apiserver exited with {status}; see {}",
                        dir.join("apiserver.log").display()
                    );
                }
                let text = fs::read_to_string(&ready).ok()?;
                let value: serde_json::Value = serde_json::from_str(&text).ok()?;
                (value["pid"].as_u64() == Some(u64::from(pid)))
                    .then(|| value["url"].as_str().unwrap().to_string())
            },
        );
        let server = ApiServer {
            dir: dir.to_path_buf(),
            child: Some(child),
            url,
        };
        server.create_rollout_namespace();
        server
    }

    /// A handle on the server that another process runs on `dir` (the
    /// kubelet, as a static pod): its URL from the state file; dropping it
    /// stops nothing.
    pub fn existing(dir: &Path) -> ApiServer {
        let text = fs::read_to_string(dir.join("state.json")).unwrap();
        let state: serde_json::Value = serde_json::from_str(&text).unwrap();
        ApiServer {
            dir: dir.to_path_buf(),
            child: None,
            url: format!("https://127.0.0.1:{}", state["apiserverPort"]),
        }
    }

    /// deploy/namespace.yaml, as in a cluster podstamp is deployed to: the
    /// daemons' default rollout namespace (already there on a restart).
    fn create_rollout_namespace(&self) {
        use serde::Deserialize;
        let text = fs::read_to_string(repo().join("deploy/namespace.yaml")).unwrap();
        // Every namespace of the file: the rollouts' and the status records'.
        let namespaces: Vec<k8s_openapi::api::core::v1::Namespace> =
            serde_norway::Deserializer::from_str(&text)
                .map(|document| {
                    k8s_openapi::api::core::v1::Namespace::deserialize(document).unwrap()
                })
                .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                kube::Api::all(self.admin().await);
            for namespace in &namespaces {
                match api.create(&Default::default(), namespace).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => panic!("deploy/namespace.yaml: {e}"),
                }
            }
        });
    }

    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.kubeconfig"))
    }

    /// SIGKILL, as if the control plane went away.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn admin(&self) -> kube::Client {
        client(&self.kubeconfig("admin")).await
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// One API server for the whole test binary. It is started from a thread
/// that lives as long as the process, so that it dies with the process.
pub fn shared_server() -> &'static ApiServer {
    static SERVER: OnceLock<&'static ApiServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // A fixed place, emptied first: the process never runs destructors
            // for statics, so a temporary directory would be left behind.
            let dir = repo().join("target/daemon-tests/shared-apiserver");
            let _ = fs::remove_dir_all(&dir);
            let server: &'static ApiServer = Box::leak(Box::new(ApiServer::start(&dir)));
            tx.send(server).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the API server failed to start")
    })
}

/// `podstamp status -o json` of the templates in `ns` whose rollout Leases
/// are in `leases`, as the admin, parsed.
pub fn status_json(server: &ApiServer, ns: &str, leases: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args(["status", "-n", ns, "--rollout-namespace", leases])
        .args(["-o", "json", "--kubeconfig"])
        .arg(server.kubeconfig("admin"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podstamp status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A port that was free a moment ago.
/// GET `path` on 127.0.0.1:`port` (a podstamp listener): (status code,
/// body); None when it does not answer.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// A port on 127.0.0.1 that nothing listens on, for a server a test starts.
/// Taken below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768 up by default), never from it: a port the kernel handed out for
/// `bind(0)` goes back to that pool once released, and any outgoing
/// connection may take it before the server binds it (seen once: a daemon
/// refused its `--listen`, address in use). From 20000: the kubelet and
/// the control plane listen on fixed ports in 10248–10259. Each process
/// starts at its own place in the range and moves on, so concurrent tests
/// do not meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (20_000, low.saturating_sub(20_000).max(1));
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = first + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!(
        "no free port on 127.0.0.1 between {first} and {}",
        first + span
    )
}

/// A running `podstamp run`.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
    pub port: u16,
}

impl Daemon {
    /// Starts `podstamp run` with these arguments (plus --listen), logging at info.
    pub fn start(args: &[&str], log: PathBuf) -> Daemon {
        // PODSTAMP_TEST_LOG overrides the daemon's log filter, e.g. `debug`.
        let filter = std::env::var("PODSTAMP_TEST_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Daemon::start_binary(
            Path::new(env!("CARGO_BIN_EXE_podstamp")),
            args,
            log,
            &filter,
        )
    }

    /// [`Daemon::start`] with this podstamp binary and log filter. The
    /// benchmarks run a copy of the binary, which a build going on meanwhile
    /// cannot replace, at the daemon's default level, `warn`, since logging
    /// every write costs time.
    pub fn start_binary(binary: &Path, args: &[&str], log: PathBuf, filter: &str) -> Daemon {
        Daemon::start_limited(binary, args, log, filter, None)
    }

    /// [`Daemon::start`] with the open file limit (soft, hard) set in the
    /// child before it runs.
    pub fn start_with_file_limit(args: &[&str], log: PathBuf, nofile: (u64, u64)) -> Daemon {
        let filter = std::env::var("PODSTAMP_TEST_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Daemon::start_limited(
            Path::new(env!("CARGO_BIN_EXE_podstamp")),
            args,
            log,
            &filter,
            Some(nofile),
        )
    }

    /// [`Daemon::start`] with these environment variables added.
    pub fn start_with_env(args: &[&str], log: PathBuf, env: &[(&str, &str)]) -> Daemon {
        let filter = std::env::var("PODSTAMP_TEST_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Daemon::start_in(
            Path::new(env!("CARGO_BIN_EXE_podstamp")),
            args,
            log,
            &filter,
            None,
            env,
        )
    }

    fn start_limited(
        binary: &Path,
        args: &[&str],
        log: PathBuf,
        filter: &str,
        nofile: Option<(u64, u64)>,
    ) -> Daemon {
        Daemon::start_in(binary, args, log, filter, nofile, &[])
    }

    fn start_in(
        binary: &Path,
        args: &[&str],
        log: PathBuf,
        filter: &str,
        nofile: Option<(u64, u64)>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let out = fs::File::create(&log).unwrap();
        let mut command = Command::new(binary);
        command
            .args(["--log-level", filter, "run", "--listen", &listen])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG")
            .env(
                "PODSTAMP_CACHE_DIR",
                repo().join("target/test-plugin-cache"),
            )
            // Not in the machine's /var/lib/podstamp, nor in the test's
            // directory (tests check what is written there); the same for
            // a restart of the same daemon (the same log).
            .env(
                "PODSTAMP_REVISIONS_DIR",
                repo()
                    .join("target/test-revisions")
                    .join(log.to_string_lossy().replace('/', "_")),
            )
            .envs(env.iter().copied())
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out);
        die_with_parent(&mut command);
        if let Some((soft, hard)) = nofile {
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("run podstamp");
        Daemon { child, log, port }
    }

    /// Starts this podstamp binary with exactly `args` and `env`, in an
    /// environment without podstamp's own variables, as a container would run
    /// it; `port` is where its listener was configured.
    pub fn start_exact(
        args: &[String],
        env: &[(String, String)],
        port: u16,
        log: PathBuf,
    ) -> Daemon {
        let out = fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_podstamp"));
        command
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG")
            .env_remove("PODSTAMP_CACHE_DIR")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out);
        die_with_parent(&mut command);
        let child = command.spawn().expect("run podstamp");
        Daemon { child, log, port }
    }

    /// The process id, to read its figures in /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` on the daemon's listener: (status code, body); None when it does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// The value of one sample in /metrics, 0 when absent.
    pub fn metric(&self, sample: &str) -> f64 {
        let (_, body) = self.get("/metrics").unwrap_or_default();
        crate::common::sample_value(&body, sample).unwrap_or(0.0)
    }

    pub fn wait_ready(&self, limit: Duration) {
        wait_for("podstamp to be ready", limit, || {
            self.assert_running();
            (self.get("/readyz")?.0 == 200).then_some(())
        });
    }

    pub fn assert_running(&self) {
        let pid = self.child.id() as i32;
        // Still our child and not exited: waitpid with WNOHANG returns 0.
        let mut status = 0;
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r == 0, "podstamp run exited; its log:\n{}", self.logs());
    }

    /// Waits for the daemon to exit on its own, for at most `limit`; its
    /// exit status.
    pub fn exited_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "podstamp run still running after {limit:?}; its log:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "podstamp did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (inode, mtime in ns) of a file.
pub fn identity(path: &Path) -> (u64, i128) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap();
    (
        m.ino(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    )
}

/// The config file for tests: substitute then node-env, from the real plugins.
pub fn write_config(dir: &Path) -> PathBuf {
    use crate::common::plugin;
    let path = dir.join("podstamp.yaml");
    let text = format!(
        "plugins:\n  substitute:\n    path: {}\n    settings: {{vars: {{greeting: hello}}}}\n    scope: [metadata, spec]\n  node-env:\n    path: {}\n    settings: {{nodeIP: \"\", labels: {{ZONE: zone}}}}\n  identity:\n    path: {}\nchain: [substitute, node-env]\nlimits: {{timeout: 2s}}\n",
        plugin("substitute").display(),
        plugin("node-env").display(),
        plugin("identity").display(),
    );
    fs::write(&path, text).unwrap();
    path
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A name unique in this run: `prefix-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Synchronous access to the API server for the tests: a client, a
/// runtime to block on, and the test's namespace. Each test file adds the
/// calls only it needs in an `impl Kube` of its own.
pub struct Kube {
    pub rt: tokio::runtime::Runtime,
    pub client: kube::Client,
    pub ns: String,
}

impl Kube {
    pub fn new(kubeconfig: &Path, ns: &str) -> Kube {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(client(kubeconfig));
        Kube {
            rt,
            client,
            ns: ns.to_string(),
        }
    }

    /// An admin client, and a fresh namespace for the test.
    pub fn admin(server: &ApiServer, ns: &str) -> Kube {
        let kube = Kube::new(&server.kubeconfig("admin"), ns);
        kube.create_namespace();
        kube
    }

    /// The test's namespace, and beside it the one its status records go
    /// to when it is also the rollout namespace (`<ns>-status`, the
    /// default a daemon derives from `--rollout-namespace <ns>`).
    pub fn create_namespace(&self) {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.client.clone());
        for name in [
            self.ns.clone(),
            podstamp::config::default_status_namespace(&self.ns),
        ] {
            let ns =
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
            self.rt
                .block_on(api.create(&Default::default(), &ns))
                .unwrap();
        }
    }

    pub fn templates(&self) -> kube::Api<k8s_openapi::api::core::v1::PodTemplate> {
        kube::Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A strategic merge patch: containers are merged by name, not replaced.
    pub fn patch_template(&self, name: &str, patch: serde_json::Value) {
        self.rt
            .block_on(self.templates().patch(
                name,
                &Default::default(),
                &kube::api::Patch::Strategic(patch),
            ))
            .unwrap();
    }
}
