//! A hostile registry for the tests: HTTPS on 127.0.0.1 with a serving
//! certificate of a CA of its own (openssl, as [`super::registry`]'s), that
//! answers each GET with what the test's `answer` says for its path —
//! honest bytes, or a body of any length generated as it is written (never
//! held in memory), with an honest `Content-Length` or chunked without one.
//! A header value's `{host}` is replaced by the registry's `127.0.0.1:PORT`
//! (a Bearer challenge's realm on the registry itself).
//! It records how many body bytes it managed to write for each request, so
//! a test can show how much a client read before it hung up.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections are served, each body
//! is written once to its end at most, every socket has a read timeout; the
//! listener is closed and its thread joined when the registry is dropped
//! (its connection threads end with their client, or at their timeout).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::registry::{own_ca, serving_certificate};

/// The most connections one hostile registry serves.
pub const MAX_CONNECTIONS: usize = 64;
/// The size of each piece of a generated body.
const PIECE: usize = 64 << 10;

/// What a body is.
pub enum Body {
    Bytes(Vec<u8>),
    /// `len` bytes of `x`, generated piece by piece as they are written;
    /// with `Content-Length: len`, or chunked without a length.
    Filler {
        len: u64,
        chunked: bool,
    },
}

/// An answer to a GET.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Answer {
    pub fn ok(bytes: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            headers: vec![],
            body: Body::Bytes(bytes),
        }
    }

    pub fn filler(status: u16, len: u64, chunked: bool) -> Answer {
        Answer {
            status,
            headers: vec![],
            body: Body::Filler { len, chunked },
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Answer {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

type Answerer = dyn Fn(&str) -> Answer + Send + Sync;

/// A request served: its path, and the body bytes written for it before
/// the client stopped reading (or the body ended).
#[derive(Debug, Clone)]
pub struct Served {
    pub path: String,
    pub written: u64,
}

/// A request being served: its own count, so that a connection still
/// writing after [`HostileRegistry::clear`] counts nowhere else.
struct Serving {
    path: String,
    written: Arc<AtomicU64>,
}

pub struct HostileRegistry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The CA its certificate is signed by.
    pub ca: PathBuf,
    served: Arc<Mutex<Vec<Serving>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HostileRegistry {
    /// Starts it in `dir` (created), answering each GET's path with
    /// `answer`.
    pub fn start(dir: &Path, answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Self {
        let ca_dir = own_ca(dir);
        let (cert, key) = serving_certificate(dir, &ca_dir);
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let served = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let answer: Arc<Answerer> = Arc::new(answer);
        let thread = {
            let (served, stop) = (served.clone(), stop.clone());
            let host_of_thread = host.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming().take(MAX_CONNECTIONS) {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (config, served, answer) = (config.clone(), served.clone(), answer.clone());
                    let host = host_of_thread.clone();
                    std::thread::spawn(move || serve(stream, config, &*answer, &served, &host));
                }
            })
        };
        HostileRegistry {
            host,
            ca: ca_dir.join("ca.crt"),
            served,
            stop,
            thread: Some(thread),
        }
    }

    /// Every request served so far, in order.
    pub fn served(&self) -> Vec<Served> {
        lock(&self.served)
            .iter()
            .map(|s| Served {
                path: s.path.clone(),
                written: s.written.load(Ordering::SeqCst),
            })
            .collect()
    }

    /// Forgets the requests served so far.
    pub fn clear(&self) {
        lock(&self.served).clear();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(&self.host);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves the requests of one connection until the client closes it.
fn serve(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    answer: &Answerer,
    served: &Mutex<Vec<Serving>>,
    host: &str,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let Ok(connection) = rustls::ServerConnection::new(config) else {
        return;
    };
    let tls = rustls::StreamOwned::new(connection, stream);
    let mut reader = BufReader::new(tls);
    // Keep-alive: a client may GET the blob on the manifest's connection.
    for _ in 0..MAX_CONNECTIONS {
        let Some(path) = read_request(&mut reader) else {
            return;
        };
        let written = Arc::new(AtomicU64::new(0));
        lock(served).push(Serving {
            path: path.clone(),
            written: written.clone(),
        });
        let mut reply = answer(&path);
        for (_, value) in &mut reply.headers {
            *value = value.replace("{host}", host);
        }
        let count = |n: u64| {
            written.fetch_add(n, Ordering::SeqCst);
        };
        if write_answer(reader.get_mut(), reply, count).is_err() {
            return;
        }
    }
}

/// The path of the next request's `GET PATH HTTP/1.1` line, its headers
/// read and dropped; None when the connection ends.
fn read_request(reader: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    let mut limited = reader.take(64 << 10);
    limited.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let path = line.split_whitespace().nth(1)?.to_string();
    loop {
        let mut header = String::new();
        if limited.read_line(&mut header).ok()? == 0 {
            return None;
        }
        if header == "\r\n" || header == "\n" {
            return Some(path);
        }
    }
}

fn write_answer(
    out: &mut impl Write,
    answer: Answer,
    mut count: impl FnMut(u64),
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Hostile\r\n", answer.status);
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match &answer.body {
        Body::Bytes(bytes) => head.push_str(&format!("Content-Length: {}\r\n", bytes.len())),
        Body::Filler {
            len,
            chunked: false,
        } => head.push_str(&format!("Content-Length: {len}\r\n")),
        Body::Filler { chunked: true, .. } => head.push_str("Transfer-Encoding: chunked\r\n"),
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    match answer.body {
        Body::Bytes(bytes) => {
            out.write_all(&bytes)?;
            count(bytes.len() as u64);
        }
        Body::Filler { len, chunked } => {
            let piece = vec![b'x'; PIECE];
            let mut left = len;
            while left > 0 {
                let n = left.min(PIECE as u64) as usize;
                if chunked {
                    out.write_all(format!("{n:x}\r\n").as_bytes())?;
                }
                out.write_all(&piece[..n])?;
                if chunked {
                    out.write_all(b"\r\n")?;
                }
                count(n as u64);
                left -= n as u64;
            }
            if chunked {
                out.write_all(b"0\r\n\r\n")?;
            }
        }
    }
    out.flush()
}
