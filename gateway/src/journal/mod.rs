//! The journal: one row per request and one per attempt, in SQLite.
//!
//! Requests hand their finished [`Record`] to a bounded channel and move on;
//! a writer thread stores rows in batches (WAL, one transaction a batch), so
//! journaling adds no latency to a request. The writer is not woken per
//! row: it commits when [`GATHER`] rows are waiting (their sender wakes it)
//! or the oldest has waited [`FLUSH_AFTER`]: a commit has a fixed
//! cost (~0.2 ms of page writes), so per row it was the journal's largest
//! cost at a quiet gateway's rates. Reading the journal through the admin
//! API, and shutting down, hurry the writer, so neither sees a stale file. A full channel or a failing disk
//! never fails a request: the row is dropped and counted. Retention by age
//! and row count runs in the writer. Only client key *names* are stored.
//!
//! Three parts: [`schema`] (the tables, the format version and the
//! migration of older files), the writer thread (batched inserts,
//! retention) and the readers behind `/admin/requests` and `tidegate log`.

mod reader;
mod schema;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};
use serde::Serialize;

use crate::classify::Class;
use crate::record::{AttemptLog, Outcome};

use reader::newest_key;
pub use reader::{Query, get, list};

/// Rows waiting to be written before new ones are dropped (≈0.5 s of a
/// saturated core's requests). The channel holding them is a list that
/// grows with what waits: a preallocated ring this size was 4.4 MB
/// resident from start, for a queue that holds a few thousand rows at
/// most when the disk keeps up.
const CHANNEL: u64 = 32_768;
/// Rows that make a commit worth it at once (the sender of the row that
/// makes this many waiting wakes the writer).
const GATHER: usize = 1024;
/// How long the first row of a batch waits for others, at most.
pub const FLUSH_AFTER: Duration = Duration::from_secs(1);
/// Rows per transaction at most.
const BATCH: usize = 8192;

/// One request, as stored.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// Request id.
    pub id: String,
    /// Arrival, unix milliseconds.
    pub ts_ms: i64,
    /// Client key name.
    pub client: Option<String>,
    /// Model alias.
    pub model: Option<String>,
    /// SSE requested.
    pub stream: bool,
    /// completed, incomplete, failed, cancelled, rejected.
    pub outcome: String,
    /// Status sent to the client.
    pub status: u16,
    /// Class of the final failure.
    pub class: Option<String>,
    /// What the client was told.
    pub error: Option<String>,
    /// Upstreams tried, in order, comma-separated.
    pub targets: String,
    /// Queue wait.
    pub queue_ms: f64,
    /// Time to first byte.
    pub ttfb_ms: Option<f64>,
    /// Total time.
    pub total_ms: f64,
    /// Input tokens, cached ones included.
    pub tokens_in: Option<u64>,
    /// Output tokens, reasoning included.
    pub tokens_out: Option<u64>,
    /// Input tokens read from the provider's prompt cache.
    pub tokens_cached: Option<u64>,
    /// Input tokens written to the prompt cache (Anthropic).
    pub tokens_cache_written: Option<u64>,
    /// Output tokens spent reasoning.
    pub tokens_reasoning: Option<u64>,
    /// Text delivered before an incomplete stream broke.
    pub partial: Option<String>,
    /// Number of attempts.
    pub n_attempts: u32,
    /// The client's volume was far above its baseline.
    pub anomaly: bool,
    /// How a JSON answer's completion was told, when not from its own
    /// bytes: `gzip-decoded`, `deflate-decoded`, `content-length` or
    /// `unverified` (see `stream::json_end`).
    pub completion_from: Option<String>,
    /// The client's protocol (`openai-chat`, `openai-responses`,
    /// `anthropic`).
    pub protocol: Option<String>,
    /// The protocol the one implied attempt was sent in, when translated.
    pub via: Option<String>,
    /// What translation left out of the request, declared.
    pub dropped: Option<String>,
    /// Attempts, in order (loaded for one request only).
    pub attempts: Vec<AttemptRow>,
}

/// One attempt, as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptRow {
    /// Upstream name.
    pub upstream: String,
    /// Its status.
    pub status: Option<u16>,
    /// Its class.
    pub class: Option<String>,
    /// What the provider said.
    pub summary: String,
    /// retry_same, next_target, requeue, resume, give_up, fatal, ok.
    pub verdict: String,
    /// Wait before the next attempt.
    pub wait_ms: Option<f64>,
    /// The protocol it was sent in, when translated.
    pub protocol: Option<String>,
}

/// A finished request on its way to the writer, built on the request path.
///
/// Small on purpose (128 bytes): handing it over is a copy into the
/// channel's slot, memory the proxy's core has not touched since the slot
/// was last used, and at saturation that copy cost as much as SQLite's
/// insert when the record was 280 bytes. So labels are enums, times are
/// integer microseconds, upstreams are indices into the names of the
/// gateway generation that served the request (shared, one per config
/// reload, so a reload that changes the upstreams keeps every row right), and what only an unusual request has (an error, partial
/// text, attempts worth storing) sits behind one pointer, allocated only
/// then. Strings the request owned are moved in, never copied.
#[derive(Debug, Clone)]
pub struct Record {
    /// Request id (its timestamp is the arrival time; see [`crate::request_id`]).
    pub id: uuid::Uuid,
    /// Client key name.
    pub client: Option<String>,
    /// Model alias (shared with the config when it is a configured one).
    pub model: Option<Arc<str>>,
    /// Queue wait, microseconds (see [`micros`]).
    pub queue_us: i64,
    /// Total time, microseconds.
    pub total_us: i64,
    /// Time to first byte, microseconds (at least 1: the zero niche
    /// keeps the field 8 bytes).
    pub ttfb_us: Option<std::num::NonZeroI64>,
    /// Tokens the upstream reported.
    pub tokens: TokenCounts,
    /// Status sent to the client.
    pub status: u16,
    /// Number of attempts.
    pub n_attempts: u16,
    /// The one upstream tried (index into the gateway's upstreams) when
    /// there are no stored attempts because its single attempt is implied
    /// (see [`implied_attempt`]).
    pub upstream: Option<u16>,
    /// How the request ended.
    pub outcome: Outcome,
    /// Class of the final failure.
    pub class: Option<Class>,
    /// SSE requested.
    pub stream: bool,
    /// The client's volume was far above its baseline.
    pub anomaly: bool,
    /// The client's protocol.
    pub protocol: Option<crate::protocol::Protocol>,
    /// The protocol the one implied attempt was sent in, when translated
    /// (stored attempts carry their own).
    pub via: Option<crate::protocol::Protocol>,
    /// The config generation whose upstream names its indices refer to
    /// (see [`Journal::register`]); two bytes, so a record stays within two
    /// cache lines.
    pub generation: u16,
    /// Error, partial text and attempts, when the request has any.
    pub detail: Option<Box<Detail>>,
}

/// A record's token counts — input, output, cached, written to the cache,
/// reasoning (see [`crate::record::Usage`]) — in 20 bytes, where five
/// `Option<u32>` take 40: `u32::MAX` is a count not reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCounts([u32; 5]);

impl TokenCounts {
    const NONE: u32 = u32::MAX;

    /// The counts of `u` (one too large for the journal is kept as the
    /// largest it can say).
    pub fn of(u: &crate::record::Usage) -> Self {
        let c =
            |n: Option<u64>| n.map_or(Self::NONE, |n| u32::try_from(n).unwrap_or(Self::NONE - 1).min(Self::NONE - 1));
        TokenCounts([c(u.input), c(u.output), c(u.cached), c(u.cache_written), c(u.reasoning)])
    }

    fn get(&self, i: usize) -> Option<u32> {
        self.0.get(i).copied().filter(|n| *n != Self::NONE)
    }

    /// Input tokens, cached ones included.
    pub fn input(&self) -> Option<u32> {
        self.get(0)
    }

    /// Output tokens, reasoning included.
    pub fn output(&self) -> Option<u32> {
        self.get(1)
    }

    /// Input tokens read from the prompt cache.
    pub fn cached(&self) -> Option<u32> {
        self.get(2)
    }

    /// Input tokens written to the prompt cache.
    pub fn cache_written(&self) -> Option<u32> {
        self.get(3)
    }

    /// Output tokens spent reasoning.
    pub fn reasoning(&self) -> Option<u32> {
        self.get(4)
    }
}

/// What only a request that is not a plain success carries.
#[derive(Debug, Clone, Default)]
pub struct Detail {
    /// What the client was told.
    pub error: Option<String>,
    /// Text delivered before an incomplete stream broke.
    pub partial: Option<String>,
    /// Attempts (the relay's own log, moved), unless the single one is
    /// implied by the request row.
    pub attempts: Vec<AttemptLog>,
    /// How the answer's completion was told, when not from its own bytes.
    pub completion_from: Option<&'static str>,
    /// What translation left out of the request.
    pub dropped: Option<String>,
}

impl Record {
    fn attempts(&self) -> &[AttemptLog] {
        self.detail.as_deref().map_or(&[], |d| d.attempts.as_slice())
    }

    /// Upstreams tried, in order, each once, comma-separated.
    fn targets<'a>(&self, names: &'a [String]) -> std::borrow::Cow<'a, str> {
        let name = |i: usize| names.get(i).map_or("", String::as_str);
        let attempts = self.attempts();
        if attempts.is_empty() {
            return self.upstream.map_or("", |i| name(usize::from(i))).into();
        }
        let mut seen: Vec<usize> = Vec::with_capacity(attempts.len());
        for a in attempts {
            if !seen.contains(&a.upstream.index()) {
                seen.push(a.upstream.index());
            }
        }
        seen.iter().map(|i| name(*i)).collect::<Vec<_>>().join(",").into()
    }
}

/// Retention settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    /// Rows older than this are deleted.
    pub max_age: Duration,
    /// At most this many request rows are kept.
    pub max_rows: u64,
}

/// What the writer stores: a request's row, or an event of the gateway.
enum Entry {
    Request(Record),
    Event(Event),
}

/// An event of the gateway itself (see [`Journal::event`]).
#[derive(Debug)]
struct Event {
    at_ms: i64,
    kind: &'static str,
    detail: String,
}

/// The upstream names of every config generation, by number.
type Generations = Arc<std::sync::RwLock<Vec<Arc<[String]>>>>;

/// Where requests send their rows; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    generations: Generations,
    tx: Sender<Entry>,
    dropped: Arc<AtomicU64>,
    path: Arc<PathBuf>,
    /// Rows handed to the writer, and rows it has written or dropped: a
    /// flush waits until the second catches up with the first.
    sent: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    /// How many flushes are waiting for rows (the writer is woken when one
    /// starts): while any is, the writer commits what it has at once.
    hurry: Arc<AtomicUsize>,
    writer: Option<std::thread::Thread>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Journal {
    /// Starts the writer for the file at `path`. The file is opened by the
    /// writer; if it cannot be, rows are counted as dropped and the writer
    /// tries again a little later.
    pub fn start(path: &Path, retention: Retention) -> Journal {
        Journal::gathering(path, retention, FLUSH_AFTER)
    }

    /// [`Journal::start`] with the longest a batch gathers as a parameter:
    /// a test lengthens it so that "waited out the gathering" and "a slow
    /// commit" are far apart.
    fn gathering(path: &Path, retention: Retention, flush_after: Duration) -> Journal {
        crate::request_id::raise_floor(newest_key(path));
        let (tx, rx) = channel::<Entry>();
        let dropped = Arc::new(AtomicU64::new(0));
        let (file, counter) = (path.to_path_buf(), dropped.clone());
        let done = Arc::new(AtomicU64::new(0));
        let handled = done.clone();
        let generations: Generations = Arc::default();
        let names = generations.clone();
        let hurry = Arc::new(AtomicUsize::new(0));
        let hurried = hurry.clone();
        let spawned = std::thread::Builder::new()
            .name("tidegate-journal".into())
            .spawn(move || writer::run(&file, &names, &retention, flush_after, &rx, &counter, &handled, &hurried));
        let writer = match spawned {
            Ok(handle) => Some(handle.thread().clone()),
            Err(err) => {
                tracing::error!(error = %err, "cannot start the journal writer; requests will not be journaled");
                None
            }
        };
        Journal {
            tx,
            dropped,
            path: Arc::new(path.to_path_buf()),
            sent: Default::default(),
            done,
            generations,
            hurry,
            writer,
        }
    }

    /// Registers the upstream names of a config generation (one per
    /// reload that changes them) and returns the number its records carry.
    pub fn register(&self, names: Arc<[String]>) -> u16 {
        let Ok(mut all) = self.generations.write() else { return 0 };
        if all.last().is_some_and(|last| *last == names) {
            return (all.len() - 1) as u16;
        }
        if all.len() > usize::from(u16::MAX) {
            // 65 536 generations: the last one is reused (rows name the
            // newest upstreams).
            all.pop();
        }
        all.push(names);
        (all.len() - 1) as u16
    }

    /// Blocks until every row handed over so far is written (or dropped by
    /// a failing disk), for up to `limit`: what a shutdown does last, and
    /// what a read of the journal through the admin API does first (so it
    /// sees the requests answered before it).
    pub fn flush(&self, limit: Duration) -> bool {
        let sent = self.sent.load(Ordering::Acquire);
        if self.done.load(Ordering::Acquire) >= sent {
            return true;
        }
        // Counted until this flush ends, not a flag the writer clears: a
        // writer that took the flag for a batch holding only some of these
        // rows would otherwise gather the rest for another second.
        self.hurry.fetch_add(1, Ordering::AcqRel);
        if let Some(writer) = &self.writer {
            writer.unpark();
        }
        let step = Duration::from_millis(5);
        let mut waited = Duration::ZERO;
        let mut caught_up = true;
        while self.done.load(Ordering::Acquire) < sent {
            if waited >= limit {
                caught_up = false;
                break;
            }
            std::thread::sleep(step);
            waited += step;
        }
        self.hurry.fetch_sub(1, Ordering::AcqRel);
        caught_up
    }

    /// Hands a record to the writer; never blocks. Rows not yet written
    /// (`sent - done`) are the queue; past [`CHANNEL`] of them the row is
    /// dropped and counted rather than held.
    pub fn record(&self, row: Record) {
        let sent = self.sent.load(Ordering::Relaxed);
        let waiting = sent.saturating_sub(self.done.load(Ordering::Acquire));
        if waiting >= CHANNEL || self.tx.send(Entry::Request(row)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.sent.fetch_add(1, Ordering::Release);
        if waiting + 1 >= GATHER as u64
            && let Some(writer) = &self.writer
        {
            // A batch worth committing now. At or past it, not exactly at
            // it: two senders on two threads may read the same count, and
            // the one row that makes GATHER would then wake nobody. (An
            // unpark of a thread not parked is an atomic store; a writer
            // already awake ends its next gathering early: harmless.)
            writer.unpark();
        }
    }

    /// Journals something the gateway itself did, that no request row
    /// says (the shared store's breaker tripping or closing): a row of the
    /// `events` table, `kind` and a sentence.
    pub fn event(&self, kind: &'static str, detail: &str) {
        let at_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let event = Event { at_ms, kind, detail: detail.to_owned() };
        if self.tx.send(Entry::Event(event)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.sent.fetch_add(1, Ordering::Release);
        if let Some(writer) = &self.writer {
            writer.unpark();
        }
    }

    /// Rows dropped so far (channel full, disk failing).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A duration as the journal stores it: integer microseconds (SQLite's
/// integers are signed; a duration beyond that saturates).
pub fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// The id's halves as the journal's two integer columns.
fn key(id: &uuid::Uuid) -> (i64, i64) {
    let (hi, lo) = id.as_u64_pair();
    (hi as i64, lo as i64)
}

#[cfg(test)]
mod tests {
    use super::reader::*;
    use super::schema::*;
    use super::writer::*;
    use super::*;
    use crate::record::Verdict;

    fn row(id: String, ts_ms: i64) -> Row {
        Row { id, ts_ms, outcome: "completed".into(), status: 200, n_attempts: 1, ..Default::default() }
    }

    fn v7(ms: i64) -> String {
        let ts = uuid::Timestamp::from_unix(uuid::NoContext, (ms / 1000) as u64, ((ms % 1000) * 1_000_000) as u32);
        uuid::Uuid::new_v7(ts).to_string()
    }

    fn class(name: &str) -> Class {
        [Class::Capacity, Class::Transient, Class::Request, Class::Auth, Class::Entitlement]
            .into_iter()
            .find(|c| c.as_str() == name)
            .unwrap()
    }

    fn outcome(name: &str) -> Outcome {
        [Outcome::Completed, Outcome::Incomplete, Outcome::Failed, Outcome::Cancelled, Outcome::Rejected]
            .into_iter()
            .find(|o| o.as_str() == name)
            .unwrap()
    }

    fn us(ms: f64) -> i64 {
        (ms * 1000.0).round() as i64
    }

    /// The record the request path would have built for `r`, with
    /// upstreams as indices into `names`.
    fn record(r: &Row, names: &[String]) -> Record {
        let index = |n: &str| crate::ids::UpstreamId::at(names.iter().position(|x| x == n).unwrap());
        let implied = implied_attempt(r).is_some_and(|i| r.attempts == [i]);
        let attempts: Vec<AttemptLog> = if implied {
            Vec::new()
        } else {
            r.attempts
                .iter()
                .map(|a| AttemptLog {
                    upstream: index(&a.upstream),
                    status: a.status,
                    class: a.class.as_deref().map(class),
                    summary: a.summary.clone(),
                    verdict: Verdict::parse(&a.verdict).unwrap(),
                    wait: a.wait_ms.map(|ms| Duration::from_micros(us(ms) as u64)),
                    protocol: a
                        .protocol
                        .as_deref()
                        .and_then(crate::protocol::Protocol::parse)
                        .map(crate::protocol::Protocol::name),
                })
                .collect()
        };
        // Test rows only: the label leaked to make it `'static` as on the request path.
        let completion_from = r.completion_from.clone().map(|c| &*Box::leak(c.into_boxed_str()));
        let detail = (r.error.is_some()
            || r.partial.is_some()
            || !attempts.is_empty()
            || completion_from.is_some()
            || r.dropped.is_some())
        .then(|| {
            Box::new(Detail {
                error: r.error.clone(),
                partial: r.partial.clone(),
                attempts,
                completion_from,
                dropped: r.dropped.clone(),
            })
        });
        Record {
            id: uuid::Uuid::parse_str(&r.id).unwrap(),
            client: r.client.clone(),
            model: r.model.as_deref().map(Arc::from),
            queue_us: us(r.queue_ms),
            total_us: us(r.total_ms),
            ttfb_us: r.ttfb_ms.map(us).and_then(std::num::NonZeroI64::new),
            tokens: TokenCounts::of(&crate::record::Usage {
                input: r.tokens_in,
                output: r.tokens_out,
                cached: r.tokens_cached,
                cache_written: r.tokens_cache_written,
                reasoning: r.tokens_reasoning,
            }),
            status: r.status,
            n_attempts: r.n_attempts as u16,
            upstream: r.targets.split(',').next().filter(|n| !n.is_empty()).map(|n| index(n).index() as u16),
            outcome: outcome(&r.outcome),
            class: r.class.as_deref().map(class),
            stream: r.stream,
            anomaly: r.anomaly,
            protocol: r.protocol.as_deref().and_then(crate::protocol::Protocol::parse),
            via: r.via.as_deref().and_then(crate::protocol::Protocol::parse),
            generation: 0,
            detail,
        }
    }

    /// Stores `rows` the way the writer stores a batch of records.
    fn store(conn: &mut Connection, rows: &[Row]) {
        let mut names: Vec<String> = Vec::new();
        for r in rows {
            for n in
                r.targets.split(',').filter(|n| !n.is_empty()).chain(r.attempts.iter().map(|a| a.upstream.as_str()))
            {
                if !names.iter().any(|x| x == n) {
                    names.push(n.to_owned());
                }
            }
        }
        let batch: Vec<Record> = rows.iter().map(|r| record(r, &names)).collect();
        insert(conn, &[Arc::from(names)], &batch).unwrap();
    }

    #[test]
    fn retention_keeps_the_newest_rows_within_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let now = jiff::Timestamp::now().as_millisecond();
        let day = 24 * 3600 * 1000;
        let rows: Vec<Row> = (0..10).map(|i| row(v7(now - (10 - i) * day), now - (10 - i) * day)).collect();
        assert!(rows.windows(2).all(|w| w[0].id < w[1].id), "UUIDv7 text sorts like time");
        store(&mut conn, &rows);
        let count = |c: &Connection| c.query_row("SELECT count(*) FROM requests", [], |r| r.get::<_, i64>(0)).unwrap();
        let deleted =
            prune(&conn, &Retention { max_age: Duration::from_secs(5 * 24 * 3600 + 60), max_rows: 100 }, 10).unwrap();
        assert_eq!((deleted, count(&conn)), (5, 5), "older than 5 days are gone");
        prune(&conn, &Retention { max_age: Duration::from_secs(100 * 24 * 3600), max_rows: 3 }, 5).unwrap();
        assert_eq!(count(&conn), 3);
        let newest = list(&path, &Query { limit: 10, ..Default::default() }).unwrap();
        let ids: Vec<&str> = newest.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, [rows[9].id.as_str(), rows[8].id.as_str(), rows[7].id.as_str()]);
    }

    #[test]
    fn a_plain_success_is_stored_once_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let ok = AttemptRow { upstream: "u".into(), status: Some(200), verdict: "ok".into(), ..Default::default() };
        let (a, b) = (v7(1), v7(2));
        let plain = Row { targets: "u".into(), attempts: vec![ok.clone()], ..row(a.clone(), 1) };
        let retried = AttemptRow {
            status: Some(429),
            class: Some("capacity".into()),
            verdict: "retry_same".into(),
            ..ok.clone()
        };
        let twice = Row { targets: "u".into(), n_attempts: 2, attempts: vec![retried, ok], ..row(b.clone(), 2) };
        store(&mut conn, &[plain.clone(), twice.clone()]);
        let stored: i64 = conn.query_row("SELECT count(*) FROM attempts", [], |r| r.get(0)).unwrap();
        assert_eq!(stored, 2, "only the retried request's attempts are rows");
        assert_eq!(get(&path, &a).unwrap().unwrap().attempts, plain.attempts);
        assert_eq!(get(&path, &b).unwrap().unwrap().attempts, twice.attempts);
    }

    #[test]
    fn list_filters_use_key_ranges_and_the_outcome_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        assert!(list(&path, &Query { limit: 5, ..Default::default() }).unwrap().is_empty(), "no file yet: empty");
        let mut conn = open(&path).unwrap();
        let now = jiff::Timestamp::now().as_millisecond();
        let rows: Vec<Row> = (0..20)
            .map(|i| {
                let ts = now - (20 - i) * 60_000;
                let outcome = if i % 5 == 0 { "failed" } else { "completed" };
                Row {
                    outcome: outcome.into(),
                    model: Some(if i % 2 == 0 { "a" } else { "b" }.into()),
                    ..row(v7(ts), ts)
                }
            })
            .collect();
        store(&mut conn, &rows);
        let ids = |q: Query| list(&path, &q).unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
        let want = |pick: &dyn Fn(usize) -> bool| {
            rows.iter().enumerate().rev().filter(|(i, _)| pick(*i)).map(|(_, r)| r.id.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            ids(Query { outcome: Some("failed".into()), limit: 10, ..Default::default() }),
            want(&|i| i % 5 == 0)
        );
        assert_eq!(
            ids(Query { outcome: Some("completed".into()), model: Some("a".into()), limit: 3, ..Default::default() }),
            want(&|i| i % 5 != 0 && i % 2 == 0)[..3].to_vec()
        );
        assert_eq!(
            ids(Query { since_ms: Some(now - 5 * 60_000 - 1), limit: 50, ..Default::default() }),
            want(&|i| i >= 15)
        );
        let plan: String = conn
            .prepare("EXPLAIN QUERY PLAN SELECT id FROM requests WHERE id >= 0 AND outcome = 'failed' AND outcome <> 'completed' ORDER BY id DESC LIMIT 5")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap()
            .join(" / ");
        assert!(plan.contains("requests_by_outcome"), "{plan}");
    }

    #[test]
    fn batches_larger_than_one_statement_keep_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let rows: Vec<Row> = (0..70)
            .map(|i| Row {
                client: Some(format!("c{i}")),
                model: Some("m".into()),
                stream: i % 2 == 0,
                class: (i % 3 == 0).then(|| "capacity".into()),
                error: (i % 3 == 0).then(|| format!("e{i}")),
                targets: "u".into(),
                queue_ms: i as f64,
                ttfb_ms: Some(1.5),
                total_ms: 2.5,
                tokens_in: Some(i as u64),
                tokens_out: None,
                tokens_cached: (i % 4 == 0).then_some(i as u64 / 2),
                tokens_cache_written: (i == 8).then_some(3),
                tokens_reasoning: (i % 5 == 0).then_some(1),
                partial: (i == 69).then(|| "part".into()),
                anomaly: i == 5,
                ..row(v7(1_000 + i as i64), 1_000 + i as i64)
            })
            .collect();
        store(&mut conn, &rows);
        let back = list(&path, &Query { limit: 100, ..Default::default() }).unwrap();
        assert_eq!(back.len(), 70, "two 32-row statements and six single rows");
        for (got, want) in back.iter().rev().zip(&rows) {
            let (g, w) = (serde_json::to_value(got).unwrap(), serde_json::to_value(want).unwrap());
            assert_eq!(g, w);
        }
    }
    #[test]
    fn a_record_fits_in_two_cache_lines() {
        assert!(std::mem::size_of::<Record>() <= 128, "{} bytes", std::mem::size_of::<Record>());
    }

    #[test]
    fn a_fifth_format_journal_gains_the_cache_and_reasoning_counts_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let now = jiff::Timestamp::now().as_millisecond();
        let new_columns = ["tokens_cached", "tokens_cache_written", "tokens_reasoning"];
        {
            let v5: Vec<String> = REQUEST_TABLE
                .iter()
                .filter(|(name, _)| !new_columns.contains(name))
                .map(|(name, ty)| format!("{name} {ty}"))
                .collect();
            let old = Connection::open(&path).unwrap();
            let view = SCHEMA.replace("tokens_cached, tokens_cache_written, tokens_reasoning,", "");
            old.execute_batch(&format!("CREATE TABLE requests ({}); {view}", v5.join(", "))).unwrap();
            let (hi, lo) = key(&uuid::Uuid::parse_str(&v7(now)).unwrap());
            old.execute(
                "INSERT INTO requests (id, id_lo, stream, outcome, status, targets, queue_us, total_us, n_attempts, tokens_in) VALUES (?1, ?2, 0, 'completed', 200, 'u', 0, 5000, 1, 7)",
                rusqlite::params![hi, lo],
            )
            .unwrap();
            old.pragma_update(None, "user_version", 5).unwrap();
        }
        let mut conn = open(&path).unwrap();
        let new = Row {
            tokens_in: Some(20),
            tokens_cached: Some(16),
            tokens_reasoning: Some(2),
            ..row(v7(now + 1), now + 1)
        };
        store(&mut conn, std::slice::from_ref(&new));
        let listed = list(&path, &Query { limit: 5, ..Default::default() }).unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        let old = listed.iter().find(|r| r.id != new.id).unwrap();
        assert_eq!((old.tokens_in, old.tokens_cached), (Some(7), None));
        let got = listed.iter().find(|r| r.id == new.id).unwrap();
        assert_eq!((got.tokens_in, got.tokens_cached, got.tokens_reasoning), (Some(20), Some(16), Some(2)));
        let viewed: Option<i64> = conn
            .query_row("SELECT tokens_cached FROM requests_view ORDER BY key DESC LIMIT 1", [], |r| r.get(0))
            .unwrap();
        assert_eq!(viewed, Some(16));
    }

    #[test]
    fn a_second_format_journal_gains_completion_from_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let now = jiff::Timestamp::now().as_millisecond();
        let old_row = Row { outcome: "completed".into(), targets: "u".into(), ..row(v7(now), now) };
        {
            // The version-2 schema: this one's without the new column.
            let v2: Vec<String> = REQUEST_TABLE
                .iter()
                .filter(|(name, _)| *name != "completion_from")
                .map(|(name, ty)| format!("{name} {ty}"))
                .collect();
            let old = Connection::open(&path).unwrap();
            old.execute_batch(&format!(
                "CREATE TABLE requests ({}); {}",
                v2.join(", "),
                SCHEMA.replace("anomaly, completion_from, id AS key", "anomaly, id AS key")
            ))
            .unwrap();
            let (hi, lo) = key(&uuid::Uuid::parse_str(&old_row.id).unwrap());
            old.execute(
                "INSERT INTO requests (id, id_lo, stream, outcome, status, targets, queue_us, total_us, n_attempts) VALUES (?1, ?2, 0, 'completed', 200, 'u', 0, 5000, 1)",
                rusqlite::params![hi, lo],
            )
            .unwrap();
            old.pragma_update(None, "user_version", 2).unwrap();
        }
        let mut conn = open(&path).unwrap();
        let new = Row { completion_from: Some("gzip-decoded".into()), ..row(v7(now + 1), now + 1) };
        store(&mut conn, std::slice::from_ref(&new));
        let listed = list(&path, &Query { limit: 5, ..Default::default() }).unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(listed.iter().find(|r| r.id == old_row.id).unwrap().completion_from, None);
        assert_eq!(listed.iter().find(|r| r.id == new.id).unwrap().completion_from.as_deref(), Some("gzip-decoded"));
        let viewed: Option<String> = conn
            .query_row("SELECT completion_from FROM requests_view ORDER BY key DESC LIMIT 1", [], |r| r.get(0))
            .unwrap();
        assert_eq!(viewed.as_deref(), Some("gzip-decoded"));
    }

    #[test]
    fn a_first_format_journal_is_set_aside_in_the_same_file_and_the_view_reads_like_the_api() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE requests (id TEXT PRIMARY KEY, ts_ms INTEGER NOT NULL, outcome TEXT NOT NULL) WITHOUT ROWID;
                 CREATE TABLE attempts (request_id TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (request_id, n)) WITHOUT ROWID;
                 CREATE INDEX requests_by_outcome ON requests (outcome, id) WHERE outcome <> 'completed';
                 INSERT INTO requests VALUES ('0190c0de-0000-7000-8000-000000000001', 1, 'failed');",
            )
            .unwrap();
        }
        let mut conn = open(&path).unwrap();
        let kept: String = conn.query_row("SELECT id FROM requests_v1", [], |r| r.get(0)).unwrap();
        assert_eq!(kept, "0190c0de-0000-7000-8000-000000000001", "old rows stay readable");
        let now = jiff::Timestamp::now().as_millisecond();
        let new = Row {
            outcome: "failed".into(),
            targets: "u".into(),
            total_ms: 12.5,
            attempts: vec![AttemptRow {
                upstream: "u".into(),
                status: Some(503),
                verdict: "give_up".into(),
                ..Default::default()
            }],
            ..row(v7(now), now)
        };
        store(&mut conn, std::slice::from_ref(&new));
        let listed = list(&path, &Query { outcome: Some("failed".into()), limit: 5, ..Default::default() }).unwrap();
        assert_eq!(listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [new.id.as_str()]);
        assert_eq!(listed[0].ts_ms, now);
        let (id, time, total): (String, String, f64) = conn
            .query_row("SELECT request_id, time_utc, total_ms FROM requests_view", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!((id.as_str(), total), (new.id.as_str(), 12.5));
        let when = jiff::Timestamp::from_millisecond(now).unwrap().strftime("%Y-%m-%d %H:%M:%S%.3f").to_string();
        assert_eq!(time, when);
        // The query the README shows.
        let failed: Vec<(String, String)> = conn
            .prepare("SELECT request_id, time_utc, outcome, error FROM requests_view WHERE outcome <> 'completed' ORDER BY key DESC LIMIT 20")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(failed, [(new.id.clone(), "failed".to_owned())]);
        drop(conn);
        assert_eq!(open(&path).map(|_| ()), Ok(()), "a second open leaves the new format alone");
        assert_eq!(get(&path, &new.id).unwrap().unwrap().attempts, new.attempts);
        assert!(get(&path, "not-a-uuid").unwrap().is_none());
        let (hi, _) = uuid::Uuid::parse_str(&new.id).unwrap().as_u64_pair();
        assert_eq!(newest_key(&path), hi, "ids made after a restart sort after this row");
    }

    /// A journal in a new directory whose batches gather for a minute, its
    /// writer started, with its file's path. (The writer's start — thread,
    /// file, schema — is not what the tests pin: a loaded machine may take
    /// a while for it.)
    fn gathering_a_minute() -> (tempfile::TempDir, PathBuf, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let retention = Retention { max_age: Duration::from_secs(3600), max_rows: 100_000 };
        let journal = Journal::gathering(&path, retention, Duration::from_secs(60));
        assert!(journal.flush(Duration::from_secs(20)), "the writer never started");
        (dir, path, journal)
    }

    #[test]
    fn a_full_batch_is_committed_without_waiting_out_the_gathering() {
        let (_dir, path, journal) = gathering_a_minute();
        let now = jiff::Timestamp::now().as_millisecond();
        // One row, then a pause: the writer holds it and sleeps (for the
        // gathering's minute, unless woken).
        journal.record(record(&row(v7(now), now), &[]));
        std::thread::sleep(Duration::from_millis(200));
        for k in 1..GATHER as i64 + 1 {
            journal.record(record(&row(v7(now + k), now), &[]));
        }
        // Without a flush: the GATHER-th waiting row's sender woke the
        // writer. 20 s is far from both a commit and the minute.
        let started = tokio::time::Instant::now();
        while journal.done.load(Ordering::Acquire) < GATHER as u64 {
            assert!(started.elapsed() < Duration::from_secs(20), "a full batch waited for the gathering");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(journal.flush(Duration::from_secs(20)));
        assert_eq!(list(&path, &Query { limit: 2000, ..Default::default() }).unwrap().len(), GATHER + 1);
    }

    #[test]
    fn a_flush_never_waits_out_the_quiet_gathering() {
        // A gathering of a minute: a flush that waited it out would take a
        // minute; a hurried commit takes one commit, which a busy disk has
        // stretched past 900 ms on CI's machine. The bound sits far from both.
        let (_dir, path, journal) = gathering_a_minute();
        let now = jiff::Timestamp::now().as_millisecond();
        for round in 0..10 {
            // Two rows handed over back to back and a flush at once: the
            // writer may hold the first when the flush begins; the second
            // must go in the same hurried commit, not wait out the
            // gathering.
            for k in 0..2 {
                journal.record(record(&row(v7(now + round * 10 + k), now), &[]));
            }
            let bound = Duration::from_secs(15);
            let started = tokio::time::Instant::now();
            assert!(journal.flush(bound), "round {round}: not flushed within {bound:?}");
            assert!(started.elapsed() < bound, "round {round}: the flush took {:?}", started.elapsed());
        }
        assert_eq!(list(&path, &Query { limit: 100, ..Default::default() }).unwrap().len(), 20);
    }
}
