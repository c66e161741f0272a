//! Child processes whose output goes to a log file, killed and reaped when dropped; free
//! ports; and a minimal plain-HTTP GET for health endpoints.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running child process; its standard output and error go to `log`.
#[derive(Debug)]
pub(crate) struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args` in `cwd`, both output streams appended to `log`, no
    /// standard input, and `envs` added to the environment.
    pub(crate) fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        cwd: &Path,
        log: PathBuf,
        envs: &[(&str, &OsStr)],
    ) -> anyhow::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (key, value) in envs {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log,
        })
    }

    /// The process's name, as given to [`Process::spawn`].
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The log file.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// The process id, while it has not been reaped.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// An error, with the tail of the log, when the process has exited.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was stopped", self.name);
        };
        if let Some(status) = child.try_wait()? {
            bail!(
                "{} exited ({status}); the end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit, then kills it.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("{} was already stopped", self.name);
        };
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        let signalled = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        if !signalled.is_ok_and(|s| s.success()) {
            let _ = child.kill();
            let status = child.wait()?;
            bail!(
                "could not send SIGTERM to {}; killed it ({status})",
                self.name
            );
        }
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if start.elapsed() >= timeout {
                let _ = child.kill();
                let status = child.wait()?;
                bail!(
                    "{} did not exit within {timeout:?} of SIGTERM; killed it ({status})",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of `path` (or why it cannot be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// `n` distinct free TCP ports on 127.0.0.1 (bound together, then released).
pub(crate) fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// `GET path` over plain HTTP/1.1: the status code and the body.
pub(crate) fn http_get(port: u16, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    http_get_at(SocketAddr::from(([127, 0, 0, 1], port)), path, timeout)
}

/// `GET path` over plain HTTP/1.1 from `addr` (such as a Pod's IP on the node's bridge): the
/// status code and the body.
pub fn http_get_at(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, String)> {
    let port = addr.port();
    let ip = addr.ip();
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP response from {addr}{path}: {head:?}"))?;
    // Go's servers (Prometheus) send a body larger than their buffer in chunks, even when the
    // connection closes after it.
    let chunked = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("transfer-encoding") && value.trim() == "chunked"
        })
    });
    if chunked {
        let body =
            dechunk(body).with_context(|| format!("a bad chunked body from {addr}{path}"))?;
        return Ok((status, body));
    }
    Ok((status, body.to_owned()))
}

/// The body of a `Transfer-Encoding: chunked` message: the chunks' data joined, up to the last
/// (empty) chunk. `None` when the framing is broken.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size_line, after) = rest.split_once("\r\n")?;
        // A chunk extension (`;name=value`) may follow the size.
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("4\r\nWiki\r\n7;x=y\r\npedia i\r\n0\r\n\r\n").as_deref(),
            Some("Wikipedia i")
        );
        assert_eq!(dechunk("0\r\n\r\n").as_deref(), Some(""));
        assert_eq!(dechunk("5\r\nabc").as_deref(), None, "a short chunk");
        assert_eq!(dechunk("zz\r\nabc\r\n").as_deref(), None, "not a size");
    }
}
