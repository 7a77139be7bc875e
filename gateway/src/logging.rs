//! Log output that stays off the request path.
//!
//! A request only appends its formatted line to a shared in-memory buffer;
//! a background thread writes the buffer to stderr 100 ms after its first
//! line, or as soon as 64 KiB have piled up, and sleeps while it is empty. A write per line (nginx's way) or a thread wake-up
//! per line (a channel to a writer thread) both cost measurable throughput
//! and tail latency on a one-core proxy (bench/); a memcpy under an
//! uncontended lock does not. If stderr blocks, lines beyond 4 MiB are dropped
//! and counted rather than stalling requests or growing without bound.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

const FLUSH_EVERY: Duration = Duration::from_millis(100);
const FLUSH_AT: usize = 64 * 1024;
const DROP_AT: usize = 4 * 1024 * 1024;

/// A spawned task that drives one HTTP connection (`connection`) to its
/// end, holds `holding` until then, and logs at debug how it ended.
///
/// A type, not `async move { connection.await }`: that task would hold the
/// connection twice, as its capture and as what it awaits (1.7 KB for an
/// upstream connection), and there is one such task per open connection,
/// client's and upstream's.
pub struct Drive<F, K> {
    /// The connection future.
    pub connection: F,
    /// Held while it runs (a connection slot).
    pub holding: K,
    /// Whose connection, for the log.
    pub what: &'static str,
}

impl<F, K, E> std::future::Future for Drive<F, K>
where
    F: std::future::Future<Output = Result<(), E>> + Unpin,
    K: Unpin,
    E: std::fmt::Display,
{
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let ended = std::task::ready!(std::pin::Pin::new(&mut self.connection).poll(cx));
        if let Err(err) = ended {
            tracing::debug!(error = %err, "{} connection ended with an error", self.what);
        }
        std::task::Poll::Ready(())
    }
}

/// A value a client or provider chose (a model name, a path, an error
/// message), written for a person to read — the log, `tidegate log`,
/// `tidegate check`: control characters (C0, DEL, C1: escape sequences,
/// NUL, BEL, CR, newlines) and the invisible characters that reorder or
/// split a terminal line (bidirectional overrides and isolates, zero-width
/// marks, line and paragraph separators) are written escaped (`\n` as
/// `\u{a}`), so no value can forge a line, recolour or retitle a terminal,
/// or make the output binary.
pub struct Clean<'a>(pub &'a str);

/// Whether `c` is written escaped by [`Clean`].
fn unsafe_to_show(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

impl std::fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(unsafe_to_show) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or('\0');
            write!(f, "{}", c.escape_unicode())?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

#[derive(Default)]
struct Shared {
    buf: Mutex<Vec<u8>>,
    wake: Condvar,
    stop: AtomicBool,
    dropped: AtomicU64,
    /// Times the thread woke to a non-empty buffer or to stop (a test
    /// checks an idle one sleeps).
    rounds: AtomicU64,
}

/// The `MakeWriter` handed to `tracing_subscriber`.
#[derive(Clone, Default)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Flushes the remaining lines and stops the writer thread when dropped;
/// keep it alive for as long as the program logs.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl BatchWriter {
    /// Starts the background writer for `out`.
    pub fn start<W: Write + Send + 'static>(mut out: W) -> (BatchWriter, FlushGuard) {
        let shared = Arc::new(Shared::default());
        let bg = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tidegate-log".into())
            .spawn(move || {
                let mut spare = Vec::with_capacity(FLUSH_AT);
                loop {
                    // A poisoned lock (a writer panicked holding it) still
                    // guards a plain buffer: used as it is.
                    let buf = bg.buf.lock().unwrap_or_else(PoisonError::into_inner);
                    // Idle: asleep until a line comes (the first line into
                    // an empty buffer wakes the thread), not woken every
                    // 100 ms to find nothing: on a quiet gateway those
                    // wake-ups were its only CPU use.
                    let mut buf = bg
                        .wake
                        .wait_while(buf, |b| b.is_empty() && !bg.stop.load(Ordering::Acquire))
                        .unwrap_or_else(PoisonError::into_inner);
                    bg.rounds.fetch_add(1, Ordering::Relaxed);
                    let stopping = bg.stop.load(Ordering::Acquire);
                    // Then the batch gathers for up to 100 ms.
                    if buf.len() < FLUSH_AT && !stopping {
                        buf = bg.wake.wait_timeout(buf, FLUSH_EVERY).unwrap_or_else(PoisonError::into_inner).0;
                    }
                    std::mem::swap(&mut *buf, &mut spare);
                    drop(buf);
                    let dropped = bg.dropped.swap(0, Ordering::Relaxed);
                    if dropped > 0 {
                        let _ = writeln!(out, "tidegate: {dropped} log lines dropped (stderr too slow)");
                    }
                    if !spare.is_empty() {
                        let _ = out.write_all(&spare);
                        let _ = out.flush();
                        spare.clear();
                    }
                    if stopping {
                        return;
                    }
                }
            })
            .ok();
        (BatchWriter { shared: shared.clone() }, FlushGuard { shared, thread })
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Under the lock, so the thread is either before its check of
        // `stop` (and sees it) or waiting (and is woken): not in between.
        let held = self.shared.buf.lock();
        self.shared.wake.notify_one();
        drop(held);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One log line being written.
pub struct LineWriter<'a> {
    shared: &'a Shared,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let Ok(mut buf) = self.shared.buf.lock() {
            if buf.len() + data.len() > DROP_AT {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                let before = buf.len();
                buf.extend_from_slice(data);
                // The first line wakes the idle thread (which then lets a
                // batch gather); 64 KiB has it write at once.
                if before == 0 || (before < FLUSH_AT && buf.len() >= FLUSH_AT) {
                    self.shared.wake.notify_one();
                }
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter { shared: &self.shared }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_reach_the_output_in_order_and_on_drop() {
        let sink = Sink::default();
        let (writer, guard) = BatchWriter::start(sink.clone());
        for i in 0..1000 {
            writer.make_writer().write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(guard);
        let out = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999], "line 999");
    }

    #[test]
    fn an_idle_writer_sleeps_until_a_line_comes_and_stops_at_once() {
        let sink = Sink::default();
        let (writer, guard) = BatchWriter::start(sink.clone());
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(writer.shared.rounds.load(Ordering::Relaxed), 0, "woke with nothing to write");
        writer.make_writer().write_all(b"one\n").unwrap();
        let mut waited = 0;
        while sink.0.lock().unwrap().is_empty() {
            assert!(waited < 100, "line not written within 1 s");
            std::thread::sleep(Duration::from_millis(10));
            waited += 1;
        }
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(writer.shared.rounds.load(Ordering::Relaxed), 1, "one line, one wake-up");
        let start = tokio::time::Instant::now();
        drop(guard);
        assert!(start.elapsed() < Duration::from_millis(500), "an idle writer stopped late");
    }

    #[test]
    fn periodic_flush_without_drop() {
        let sink = Sink::default();
        let (writer, _guard) = BatchWriter::start(sink.clone());
        writer.make_writer().write_all(b"hello\n").unwrap();
        for _ in 0..100 {
            if !sink.0.lock().unwrap().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("line not flushed within 1 s");
    }
}

#[cfg(test)]
mod clean_tests {
    use super::Clean;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(Clean("gpt\nrequest id=forged\u{0}").to_string(), "gpt\\u{a}request id=forged\\u{0}");
        assert_eq!(Clean("plain-model é").to_string(), "plain-model é");
        assert_eq!(Clean("a\u{1b}[2J\u{7}\rb").to_string(), "a\\u{1b}[2J\\u{7}\\u{d}b");
        assert_eq!(Clean("x\u{202e}gpj.exe\u{2028}y\u{9b}").to_string(), "x\\u{202e}gpj.exe\\u{2028}y\\u{9b}");
    }
}
