//! Log lines written to stderr in batches: one `write` per batch instead of one per line.
//!
//! The webhook logs a line per admission; at tens of thousands of admissions a second, the
//! `write` of each line was about 5% of its CPU. Lines are appended to a buffer, which is
//! written when it holds [`BATCH_BYTES`], every [`FLUSH_EVERY`] by a thread of its own, and
//! when the command ends (or a second signal cuts it short): a line reaches stderr at most
//! [`FLUSH_EVERY`] after it was logged, in the order lines were logged. A logging thread that
//! fills the buffer writes it itself, so a stderr nobody reads blocks logging as it did, and
//! the buffer stays bounded.

use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How much is buffered before the thread that logs writes it.
pub const BATCH_BYTES: usize = 64 * 1024;

/// How long a line waits at most.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Stderr, written in batches. Cloning shares the buffer.
#[derive(Clone)]
pub struct BatchedStderr {
    shared: Arc<Shared>,
}

struct Shared {
    /// Where batches go: stderr.
    sink: fn(&[u8]),
    /// Lines not yet written.
    pending: Mutex<Vec<u8>>,
    /// Held while a batch is taken and written, so that batches go out in the order they
    /// were taken; holds the buffer the next batch is swapped into.
    writing: Mutex<Vec<u8>>,
}

/// The one the process logs through, flushed by [`flush`].
static INSTALLED: OnceLock<BatchedStderr> = OnceLock::new();

impl BatchedStderr {
    /// The process's batched stderr, with its flushing thread started on first use.
    pub fn installed() -> std::io::Result<BatchedStderr> {
        if let Some(installed) = INSTALLED.get() {
            return Ok(installed.clone());
        }
        let batched = BatchedStderr::to(write_stderr);
        let shared = Arc::clone(&batched.shared);
        std::thread::Builder::new()
            .name("log-flush".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(FLUSH_EVERY);
                    shared.flush();
                }
            })?;
        Ok(INSTALLED.get_or_init(|| batched).clone())
    }
}

impl BatchedStderr {
    fn to(sink: fn(&[u8])) -> BatchedStderr {
        BatchedStderr {
            shared: Arc::new(Shared {
                sink,
                pending: Mutex::new(Vec::with_capacity(BATCH_BYTES)),
                writing: Mutex::new(Vec::with_capacity(BATCH_BYTES)),
            }),
        }
    }
}

fn write_stderr(batch: &[u8]) {
    // Nowhere to report a failure to write the log.
    let _ = std::io::stderr().lock().write_all(batch);
}

/// Writes what the process logged and has not written yet.
pub fn flush() {
    if let Some(installed) = INSTALLED.get() {
        installed.shared.flush();
    }
}

/// A poisoned lock still guards a valid buffer: a panic while appending bytes leaves bytes.
fn lock(mutex: &Mutex<Vec<u8>>) -> MutexGuard<'_, Vec<u8>> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn flush(&self) {
        let mut batch = lock(&self.writing);
        std::mem::swap(&mut *lock(&self.pending), &mut *batch);
        if !batch.is_empty() {
            (self.sink)(&batch);
            batch.clear();
        }
    }
}

/// The writer of one log line.
pub struct LineWriter<'a> {
    shared: &'a Shared,
}

impl std::io::Write for LineWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let full = {
            let mut pending = lock(&self.shared.pending);
            pending.extend_from_slice(bytes);
            pending.len() >= BATCH_BYTES
        };
        if full {
            self.shared.flush();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchedStderr {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write as _;

    use super::*;

    static WRITTEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());

    fn written() -> Vec<u8> {
        std::mem::take(&mut *lock(&WRITTEN))
    }

    #[test]
    fn lines_wait_until_the_buffer_is_full_or_flushed_and_keep_their_order() {
        let batched = BatchedStderr::to(|batch| lock(&WRITTEN).extend_from_slice(batch));
        batched.make_writer().write_all(b"one\n").unwrap();
        batched.make_writer().write_all(b"two\n").unwrap();
        assert!(written().is_empty(), "nothing written before a flush");
        batched.shared.flush();
        assert_eq!(written(), b"one\ntwo\n");
        batched.shared.flush();
        assert!(written().is_empty(), "written once");

        let line = vec![b'x'; BATCH_BYTES / 2];
        batched.make_writer().write_all(&line).unwrap();
        assert!(written().is_empty());
        batched.make_writer().write_all(b"y").unwrap();
        batched.make_writer().write_all(&line).unwrap();
        let batch = written();
        assert_eq!(
            batch.len(),
            BATCH_BYTES + 1,
            "written by the line that filled it"
        );
        assert_eq!(batch[BATCH_BYTES / 2], b'y');
    }
}
