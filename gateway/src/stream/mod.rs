//! The response body relayed to the client, and the stream handshake.
//!
//! [`RelayBody`] forwards upstream bytes as they arrive. For SSE it forwards
//! whole events (a partial event is held only until its end arrives), reads
//! usage and text on the way without delaying anything, and never lets a
//! broken stream look finished: a dropped connection, an idle gap above
//! `stream_idle_timeout` or an end without the protocol's end marker becomes
//! a protocol-shaped error event, and the request is reported `incomplete`
//! with the text already delivered. After the protocol's terminal event
//! the stream is complete, whatever the connection does next: nothing
//! more is read from it for the stream (the body's end is read apart, so
//! the connection can be reused: [`UpstreamBody::settle`]). Dropping the
//! body (client gone) drops the upstream connection at once.
//!
//! The body does not own the request: its owner ([`crate::exchange`])
//! polls it, takes its [`End`] when it has one, and is asked
//! ([`RelayBody::asked`]) when a broken stream may be continued.

pub mod handshake;
pub mod json_end;
pub mod resume;
pub mod shape;
pub mod sse;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::upstream::UpstreamBody;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::classify::Class;
use crate::ids::UpstreamId;
use crate::protocol::events::Kind;
use crate::protocol::{ErrorKind, Protocol};
use crate::record::{AttemptLog, Outcome, Usage, Verdict};
use sse::Scanner;

use crate::secrets;

/// Most bytes of an unreadable event quoted in the report of the break.
const UNREADABLE_EXCERPT: usize = 120;

/// Most text kept for a report of a broken stream.
pub const PARTIAL_CAP: usize = 64 * 1024;

/// Why a relayed raw (non-SSE) body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The upstream connection failed mid-body.
    #[error("upstream body failed: {0}")]
    Upstream(#[from] crate::upstream::ReadError),
    /// No chunk within the idle limit.
    #[error("upstream sent nothing for {0:?}")]
    Idle(Duration),
}

/// How an answer ended, for its owner's record.
#[derive(Debug)]
pub struct End {
    /// Completed, or incomplete (broken, cut, an error event mid-way).
    pub outcome: Outcome,
    /// Tokens the upstream reported.
    pub usage: Usage,
    /// How a JSON answer's completion was told when not from its own
    /// bytes (see [`json_end::Judged::label`]).
    pub completion_from: Option<&'static str>,
    /// The text delivered before an incomplete stream broke.
    pub partial: Option<String>,
    /// The class of an incomplete stream's failure.
    pub class: Option<Class>,
    /// Why it did not complete.
    pub error: Option<String>,
}

/// A broken stream the owner may continue: why it broke, the text
/// delivered so far, and the attempt row that says so.
pub struct Ask<'a> {
    /// Why it broke.
    pub why: &'a str,
    /// The text delivered so far (the continuation's assistant turn).
    pub text: &'a str,
    /// The row for the request's attempts.
    pub log: AttemptLog,
}

/// Upstream body on its way to the client.
pub struct RelayBody {
    /// The upstream's body while it is read (a JSON answer relayed as it
    /// streams, or SSE).
    inner: Option<UpstreamBody>,
    /// What the answer is and how it is read.
    source: Source,
    /// The protocol of the events tidegate writes itself (the target's;
    /// a translated stream's are the client's, written by its translator).
    protocol: Protocol,
    /// The upstream answering (index, name).
    upstream: (UpstreamId, String),
    /// What the wait for the next frame watches.
    watch: Watch,
    /// Continuing a broken stream.
    resume: Resume,
    /// Events held for one write while more arrive at once.
    gather: Gather,
    /// A last frame to send (a synthesised error event, or a JSON answer
    /// read whole), then the end.
    last: Option<Bytes>,
    outcome: Option<(Outcome, Option<String>)>,
    /// How it ended, once it has, until the owner takes it.
    ended: Option<End>,
}

/// What an answer is, and how it is read on its way.
#[expect(
    clippy::large_enum_variant,
    reason = "the body itself is boxed once (a relayed answer's one allocation); a box per variant would add one"
)]
enum Source {
    /// A JSON answer relayed as it streams; its end and usage read from
    /// its last bytes (decoded if it is compressed).
    Raw(json_end::JsonEnd),
    /// A JSON answer read whole (to check it, or translated), sent as one
    /// frame; the stored-state id it names, if any.
    Whole(json_end::JsonEnd, Option<String>),
    /// SSE, relayed by whole events.
    Sse(SseSource),
}

/// An SSE answer's reading.
struct SseSource {
    /// The events: framed, inspected, held until whole.
    scanner: Scanner,
    /// Bytes of `scanner` already scanned and ready to forward.
    ready: usize,
    /// A stream from a target of another protocol: its events are read
    /// (scanned) in the target's grammar and sent in the client's.
    translator: Option<Box<crate::translate::Stream>>,
}

/// What the wait for the next frame watches: the idle limit (its timer
/// armed lazily: a body that is always ready never touches it) and the
/// end of the shutdown grace.
struct Watch {
    idle: Duration,
    last_frame: Instant,
    timer: Option<Pin<Box<Sleep>>>,
    /// Resolves when the shutdown grace is over: the stream then ends with
    /// its protocol's error event.
    closing: Option<Closing>,
    /// The waker the idle timer and `closing` were last polled with: while
    /// the task's waker is the same, each has it already, and a wait for
    /// the next event asks them only whether they fired (a flag each)
    /// instead of polling both again (~300 instructions an event).
    armed_for: Option<Waker>,
}

/// Continuing a broken stream (`stream_resume`).
struct Resume {
    /// Continuations it may still ask for, and until when.
    resumes: u8,
    until: Instant,
    /// The stream broke and may be continued: why, until the owner
    /// answers (with a continuation, or a refusal).
    asking: Option<String>,
    /// A continuation started and has sent no content yet: its opening
    /// events are dropped (the client has the answer's opening), and the
    /// original break's reason is kept for the message if it breaks too.
    continuing: Option<String>,
}

/// Events held for one write while more arrive at once (see
/// [`GATHER_MAX`]).
struct Gather {
    /// Events ready for the client, held.
    gathered: BytesMut,
    /// Turns given to the upstream connection with nothing new since.
    yielded: u8,
    /// The end came while events were held: they went out, the end is next.
    finished: bool,
    /// A frame was produced already (the first one is never held).
    started_sending: bool,
    /// The last frame came within [`BURST_GAP`] of the one before: more
    /// may be on their way at once, worth gathering.
    burst: bool,
}

impl Source {
    fn sse(&self) -> Option<&SseSource> {
        match self {
            Source::Sse(sse) => Some(sse),
            Source::Raw(_) | Source::Whole(..) => None,
        }
    }

    fn sse_mut(&mut self) -> Option<&mut SseSource> {
        match self {
            Source::Sse(sse) => Some(sse),
            Source::Raw(_) | Source::Whole(..) => None,
        }
    }

    fn scanner(&self) -> Option<&Scanner> {
        self.sse().map(|s| &s.scanner)
    }

    fn scanner_mut(&mut self) -> Option<&mut Scanner> {
        self.sse_mut().map(|s| &mut s.scanner)
    }

    fn translated(&self) -> bool {
        self.sse().is_some_and(|s| s.translator.is_some())
    }

    fn translator_mut(&mut self) -> Option<&mut crate::translate::Stream> {
        self.sse_mut().and_then(|s| s.translator.as_deref_mut())
    }
}

/// The shutdown signal a stream ends on: the wait (polled to be woken)
/// and its token (read to know it fired without polling the wait).
struct Closing {
    over: crate::closing::Closing,
    wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// Frames closer together than this are a burst (see [`GATHER_MAX`]);
/// farther apart, as a model's tokens are, each goes out as it comes.
const BURST_GAP: Duration = Duration::from_millis(1);

/// Most SSE bytes gathered before forwarding. hyper's client hands an
/// answer's body over one chunk per turn of its connection task, and
/// hyper's server writes whatever it holds each time the body waits: an
/// upstream burst of 20 events would leave as 20 writes (and 20 wake-ups
/// of the client). Instead, while the stream goes on, events are held and
/// the body gives the connection task its turns; what is there when a turn
/// brings nothing new (or this many bytes, or the end, or a synthesised
/// event) goes out in one write. Only in a burst (frames within
/// [`BURST_GAP`]): an event that comes alone, as a model's tokens do
/// tens of milliseconds apart, goes out at once, without the two extra
/// polls of its task that holding it would cost (with 1,000 open streams
/// that was a quarter of tidegate's CPU per event). Nothing is reordered
/// or withheld past the next quiet turn.
const GATHER_MAX: usize = 16 * 1024;

impl RelayBody {
    /// A body passed through as is (JSON answers); `json` reads its end
    /// (from its headers: see [`json_end`]).
    pub fn raw(
        inner: UpstreamBody,
        json: json_end::JsonEnd,
        idle: Duration,
        protocol: Protocol,
        upstream: (UpstreamId, &str),
    ) -> Self {
        Self::new(Some(inner), idle, Source::Raw(json), protocol, upstream)
    }

    /// A JSON answer already read whole (to check it): sent as one frame;
    /// `id` is the stored state it names, if any.
    pub fn read(
        bytes: Bytes,
        mut json: json_end::JsonEnd,
        protocol: Protocol,
        upstream: (UpstreamId, &str),
        id: Option<String>,
    ) -> Self {
        json.feed(&bytes);
        let mut body = Self::new(None, Duration::ZERO, Source::Whole(json, id), protocol, upstream);
        body.last = Some(bytes);
        body
    }

    /// An SSE body continuing from a handshake: `scanner` holds what was
    /// read so far, `ready` bytes of which are complete events to send first.
    pub fn sse(
        inner: UpstreamBody,
        idle: Duration,
        scanner: Scanner,
        ready: usize,
        protocol: Protocol,
        upstream: (UpstreamId, &str),
    ) -> Self {
        let source = Source::Sse(SseSource { scanner, ready, translator: None });
        Self::new(Some(inner), idle, source, protocol, upstream)
    }

    fn new(
        inner: Option<UpstreamBody>,
        idle: Duration,
        source: Source,
        protocol: Protocol,
        upstream: (UpstreamId, &str),
    ) -> Self {
        let now = Instant::now();
        Self {
            inner,
            source,
            protocol,
            upstream: (upstream.0, upstream.1.to_owned()),
            watch: Watch { idle, last_frame: now, timer: None, closing: None, armed_for: None },
            resume: Resume { resumes: 0, until: now, asking: None, continuing: None },
            gather: Gather {
                gathered: BytesMut::new(),
                yielded: 0,
                finished: false,
                started_sending: false,
                burst: false,
            },
            last: None,
            outcome: None,
            ended: None,
        }
    }

    /// The id the upstream gave a Responses answer (its stored state): from
    /// `response.created` in a stream, or the JSON answer read whole.
    pub fn response_id(&self) -> Option<String> {
        match &self.source {
            Source::Sse(sse) if sse.translator.is_none() => sse.scanner.seen.response_id.clone(),
            Source::Whole(_, id) => id.clone(),
            Source::Sse(_) | Source::Raw(_) => None,
        }
    }

    /// Ends this stream with its protocol's error event when `closing`
    /// is closed (the shutdown grace is over).
    pub fn close_with(&mut self, closing: &crate::closing::Closing) {
        self.watch.closing = Some(Closing { over: closing.clone(), wait: Box::pin(closing.cancelled_owned()) });
        self.watch.armed_for = None;
    }

    /// Sends this stream's events in the client's protocol (`back`
    /// says which). A translated stream is not continued after a break
    /// (a continuation is built in the client's protocol).
    pub fn translate(&mut self, back: &crate::translate::Back) {
        if let Some(sse) = self.source.sse_mut() {
            sse.translator = crate::translate::Stream::new(back, sse.scanner.max_event()).map(Box::new);
        }
        self.resume.resumes = 0;
    }

    /// Lets a broken text stream ask its owner for up to `tries`
    /// continuations before `until` instead of failing.
    pub fn allow_resumes(&mut self, tries: u8, until: Instant) {
        if !self.source.translated() {
            self.resume.resumes = tries;
            self.resume.until = until;
        }
    }

    /// Whether this answer is an SSE stream (only a stream can be
    /// continued).
    pub fn is_sse(&self) -> bool {
        self.source.sse().is_some()
    }

    /// Whether this answer may be continued if it breaks: an SSE stream
    /// in the client's own protocol (a translated one is not: a
    /// continuation is built from the client's request).
    pub fn may_be_continued(&self) -> bool {
        self.source.sse().is_some() && !self.source.translated()
    }

    /// Whether this answer could ever ask for a continuation (an SSE
    /// stream that is allowed to).
    pub fn may_resume(&self) -> bool {
        self.resume.resumes > 0 && self.source.sse().is_some()
    }

    /// Asks to be continued if this stream may be resumed.
    fn try_resume(&mut self, why: &str) -> bool {
        let Some(scanner) = self.source.scanner() else { return false };
        let seen = &scanner.seen;
        let resumable = self.resume.resumes > 0
            && seen.content
            && !seen.tool_call
            && seen.error.is_none()
            && seen.text.len() < PARTIAL_CAP
            && Instant::now() < self.resume.until;
        if !resumable {
            return false;
        }
        self.resume.asking = Some(why.to_owned());
        true
    }

    /// The break the owner is asked to continue, if any (the body then
    /// has ended its frames until it is answered).
    pub fn asked(&self) -> Option<Ask<'_>> {
        let why = self.resume.asking.as_deref()?;
        let seen = &self.source.scanner()?.seen;
        let log = AttemptLog {
            upstream: self.upstream.0,
            status: None,
            class: Some(Class::Transient),
            summary: format!(
                "stream broke after {} events ({why}); resuming from {} bytes of text",
                seen.events,
                seen.text.len()
            ),
            verdict: Verdict::Resume,
            wait: None,
            protocol: None,
        };
        Some(Ask { why, text: &seen.text, log })
    }

    /// A continuation started: its events follow the delivered ones in the
    /// same client stream.
    pub fn continue_with(&mut self, reopened: resume::Reopened) {
        self.resume.continuing = self.resume.asking.take();
        self.resume.resumes = self.resume.resumes.saturating_sub(1);
        if let Some(sse) = self.source.sse_mut() {
            // Drop the dead stream's unfinished event; go on with the
            // continuation's.
            sse.scanner.discard();
            sse.scanner.feed_bytes(reopened.first.clone());
            sse.ready = 0;
        }
        self.inner = Some(reopened.inner);
        self.watch.last_frame = Instant::now();
        self.upstream = reopened.upstream;
        self.gather.finished = false;
    }

    /// No continuation (it could not be built, or it failed: `failed`):
    /// the stream ends with its error event.
    pub fn not_continued(&mut self, failed: Option<&str>) {
        let Some(why) = self.resume.asking.take() else { return };
        self.resume.resumes = 0;
        let why = match failed {
            Some(err) => format!("{why}; resuming failed: {err}"),
            None => why,
        };
        self.last = self.break_stream(why);
        self.gather.finished = false;
    }

    /// Takes what a continuation needs from a stream the relay just opened:
    /// the rest of its body, the bytes read so far.
    pub fn into_continuation(mut self) -> Option<resume::Reopened> {
        let inner = self.inner.take()?;
        let first = self.source.scanner_mut().map(|s| s.take(s.held())).unwrap_or_default();
        Some(resume::Reopened { inner, first, upstream: self.upstream })
    }

    /// How it ended, once it has (taken once).
    pub fn take_end(&mut self) -> Option<End> {
        self.ended.take()
    }

    /// What a stream cut short by its client had delivered: usage, and
    /// the text if any content went out.
    pub fn cut(&mut self) -> (Usage, Option<String>) {
        match self.source.scanner_mut() {
            Some(sse) => {
                let text = sse.seen.content.then(|| std::mem::take(&mut sse.seen.text));
                (sse.seen.usage, text)
            }
            None => (Usage::default(), None),
        }
    }

    /// The stream broke: resume it if allowed, else end it with a
    /// protocol-shaped error event.
    fn break_stream(&mut self, why: String) -> Option<Bytes> {
        self.inner = None;
        let why = match self.resume.continuing.take() {
            // The continuation broke before its first content: that is the
            // continuation failing, not a new break to resume from.
            Some(first) => {
                self.resume.resumes = 0;
                format!("{first}; resuming failed: the continuation broke before any content ({why})")
            }
            None => why,
        };
        if self.try_resume(&why) {
            return None;
        }
        let chunks = self.source.scanner().map_or(0, |s| s.seen.events);
        let message = format!(
            "tidegate: the stream from upstream {} broke after {chunks} events: {why}; the answer is incomplete",
            self.upstream.1
        );
        self.outcome = Some((Outcome::Incomplete, Some(message.clone())));
        match self.source.translator_mut() {
            Some(t) => Some(t.fail(ErrorKind::Api, &message)),
            None => Some(self.protocol.error_event(ErrorKind::Api, &message)),
        }
    }

    fn end(&mut self) {
        let mut judged = None;
        let usage = match &mut self.source {
            Source::Sse(sse) => sse.scanner.seen.usage,
            Source::Raw(json) | Source::Whole(json, _) => {
                let end = json.finish();
                if self.outcome.is_none() && !end.complete {
                    // A body delimited by the connection's close cannot say
                    // it was cut; a JSON answer that does not end as JSON
                    // (once decoded) was.
                    let why = "the upstream's JSON answer ended before its end (connection closed early)";
                    self.outcome = Some((Outcome::Incomplete, Some(why.into())));
                }
                judged = end.judged.label();
                end.usage
            }
        };
        let (outcome, error) = self.outcome.take().unwrap_or((Outcome::Completed, None));
        let (partial, class) = match self.source.scanner_mut() {
            Some(sse) if outcome == Outcome::Incomplete => {
                (Some(std::mem::take(&mut sse.seen.text)), Some(Class::Transient))
            }
            _ => (None, None),
        };
        self.ended = Some(End { outcome, usage, completion_from: judged, partial, class, error });
    }

    /// Scans buffered SSE bytes: returns a frame of complete events to send,
    /// stopping after an upstream error event, or before an event a
    /// translated stream cannot read (the break is then `last`).
    fn drain_events(&mut self) -> Option<Bytes> {
        let Source::Sse(src) = &mut self.source else { return None };
        let SseSource { scanner: sse, ready, translator } = src;
        let mut error = false;
        let mut unreadable = None;
        while let Some((kind, end)) = sse.next_event() {
            if kind == Kind::Unreadable && translator.is_some() {
                unreadable = Some(end - *ready);
                break;
            }
            *ready = end;
            match kind {
                Kind::Error => {
                    error = true;
                    break;
                }
                // The terminal event: the answer is complete. Nothing
                // after it is read here, so a reset or an idle connection
                // afterwards cannot make it look broken; the rest of the
                // body is read apart, for the connection's reuse.
                Kind::Done => {
                    if let Some(inner) = self.inner.take() {
                        inner.settle();
                    }
                    break;
                }
                // A continuation's opening: the client already has it.
                Kind::KeepAlive | Kind::Start | Kind::BlockStart if self.resume.continuing.is_some() => {
                    sse.take(end);
                    *ready = 0;
                }
                Kind::Content | Kind::Unreadable => self.resume.continuing = None,
                Kind::KeepAlive | Kind::Start | Kind::BlockStart => {}
            }
        }
        if error {
            // The upstream's own error event is the protocol-correct
            // error: send it, and nothing after it (no `[DONE]`).
            self.inner = None;
            let detail = sse.seen.error.as_deref().map(|e| String::from_utf8_lossy(&secrets::scrub(e)).into_owned());
            let detail = detail.unwrap_or_default();
            self.outcome = Some((Outcome::Incomplete, Some(format!("upstream error event mid-stream: {detail}"))));
        }
        let mut out = (*ready > 0).then(|| sse.take(*ready));
        *ready = 0;
        if error {
            sse.discard();
            // The provider's error event is its text: no secret in it
            // reaches the client (see `crate::secrets`).
            out = out.map(secrets::scrub_bytes);
        }
        let bad = unreadable.map(|len| {
            let bad = sse.take(len);
            sse.discard();
            bad
        });
        let (out, broken) = match (out, translator.as_deref_mut()) {
            (Some(out), Some(t)) => (Some(t.events(&out)).filter(|b| !b.is_empty()), t.take_broken()),
            (out, _) => (out, None),
        };
        if broken.is_some() {
            sse.discard();
        }
        if let Some(why) = broken {
            self.resume.resumes = 0;
            self.last = self.break_stream(why);
            return out;
        }
        if let Some(bad) = bad {
            // What came before it is sent (translated first: the error
            // event ends the client's stream), then the client's error
            // event; the journal keeps the text up to it.
            let excerpt = secrets::scrub_bytes(bad.slice(..bad.len().min(UNREADABLE_EXCERPT)));
            let excerpt = String::from_utf8_lossy(&excerpt).trim().to_owned();
            self.resume.resumes = 0;
            self.last = self.break_stream(format!("the upstream sent an event that is not JSON ({excerpt:?})"));
        }
        out
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    /// The events [`RelayBody::poll_event`] yields, gathered while more
    /// arrive at once (see [`GATHER_MAX`]).
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.gather.finished {
            return Poll::Ready(None);
        }
        let send = |gathered: &mut BytesMut| Poll::Ready(Some(Ok(Frame::data(gathered.split().freeze()))));
        loop {
            let polled = this.poll_event(cx);
            // The first event goes out at once (time to first token).
            let gathering = this.gather.started_sending
                && this.gather.burst
                && this.source.sse().is_some()
                && this.inner.is_some()
                && this.last.is_none()
                && this.resume.asking.is_none();
            this.gather.started_sending = true;
            match polled {
                Poll::Ready(Some(Ok(data))) if gathering => {
                    this.gather.gathered.extend_from_slice(&data);
                    this.gather.yielded = 0;
                    if this.gather.gathered.len() >= GATHER_MAX {
                        return send(&mut this.gather.gathered);
                    }
                }
                Poll::Ready(Some(Ok(data))) if !this.gather.gathered.is_empty() => {
                    this.gather.gathered.extend_from_slice(&data);
                    return send(&mut this.gather.gathered);
                }
                Poll::Ready(None) if !this.gather.gathered.is_empty() => {
                    this.gather.finished = true;
                    return send(&mut this.gather.gathered);
                }
                Poll::Pending if !this.gather.gathered.is_empty() => {
                    // Let the upstream connection deliver what it already
                    // holds (it takes two turns of its task); forward what
                    // is here once a turn brings nothing new.
                    if this.gather.yielded < 2 {
                        this.gather.yielded += 1;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    this.gather.yielded = 0;
                    return send(&mut this.gather.gathered);
                }
                other => return other.map(|next| next.map(|item| item.map(Frame::data))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never claim the end early: the end is where the report is written.
        false
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.source, &self.inner, &self.last) {
            (Source::Raw(_), Some(inner), _) => inner.size_hint(),
            // A JSON answer read whole (checked, or translated): its
            // length is known, and sent as `Content-Length`, not chunked.
            (Source::Raw(_) | Source::Whole(..), None, Some(whole)) => SizeHint::with_exact(whole.len() as u64),
            _ => SizeHint::default(),
        }
    }
}

impl RelayBody {
    /// The next bytes as the upstream's answer gives them: whole SSE events
    /// (or raw bytes), a synthesised last event, or the end. (Only data:
    /// an upstream's trailers are not passed on.)
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        loop {
            if self.resume.asking.is_some() {
                // Broken, and its owner is asked to continue it: no
                // frames until it answers.
                return Poll::Ready(None);
            }
            if let Some(frame) = self.drain_events() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(last) = self.last.take() {
                if self.inner.is_none() && self.source.sse().is_none() {
                    // A JSON answer read whole is sized (`size_hint`), and
                    // hyper stops polling once it is sent: its end comes
                    // with it.
                    self.end();
                    self.gather.finished = true;
                }
                return Poll::Ready(Some(Ok(last)));
            }
            let Some(inner) = self.inner.as_mut() else {
                // A finished answer whose target sent no terminal event of
                // its own still gets the client's.
                if self.outcome.is_none()
                    && self.source.scanner().is_some_and(|s| s.seen.complete)
                    && let Some(tail) = self.source.translator_mut().map(|t| t.finish()).filter(|b| !b.is_empty())
                {
                    return Poll::Ready(Some(Ok(tail)));
                }
                self.end();
                return Poll::Ready(None);
            };
            match Pin::new(inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = self.received(frame) {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Ready(Some(Err(_))) if self.source.scanner().is_some_and(|s| s.seen.complete) => {
                    self.inner = None;
                }
                Poll::Ready(Some(Err(err))) => {
                    if self.source.sse().is_none() {
                        self.inner = None;
                        self.outcome = Some((Outcome::Incomplete, Some(format!("upstream body failed: {err}"))));
                        self.end();
                        return Poll::Ready(Some(Err(BodyError::Upstream(err))));
                    }
                    self.last = self.break_stream(format!("connection to the upstream failed ({err})"));
                }
                Poll::Ready(None) => {
                    self.inner = None;
                    let unfinished = self.source.scanner().is_some_and(|s| !s.seen.complete);
                    if unfinished {
                        self.last = self.break_stream("the upstream ended the stream without its end marker".into());
                    }
                }
                Poll::Pending => {
                    if let Some(poll) = self.idle(cx) {
                        return poll;
                    }
                }
            }
        }
    }

    /// A frame from the upstream: SSE bytes go to the scanner (their
    /// events are drained on the next turn), a JSON body's bytes are
    /// relayed as they came (`Some`).
    #[inline]
    fn received(&mut self, frame: Frame<Bytes>) -> Option<Bytes> {
        let now = Instant::now();
        self.gather.burst = now.saturating_duration_since(self.watch.last_frame) < BURST_GAP;
        self.watch.last_frame = now;
        let data = frame.into_data().ok()?;
        let oversized = match &mut self.source {
            Source::Sse(sse) => {
                sse.scanner.feed_bytes(data);
                sse.scanner.oversized().then(|| sse.scanner.max_event())
            }
            Source::Raw(json) | Source::Whole(json, _) => {
                json.feed(&data);
                // hyper stops polling once a sized body is complete:
                // record the end with the last bytes.
                if self.inner.as_ref().is_some_and(|i| i.is_end_stream()) {
                    self.inner = None;
                    self.end();
                }
                return Some(data);
            }
        };
        if let Some(max) = oversized {
            self.resume.resumes = 0;
            self.last = self.break_stream(format!("the upstream sent an event over {max} bytes (max_stream_event)"));
        }
        None
    }

    /// The upstream has nothing now: wait for its next frame, unless the
    /// shutdown grace ended or the idle limit passed (then the stream
    /// breaks). `None`: look again (something changed).
    #[inline]
    fn idle(&mut self, cx: &mut Context<'_>) -> Option<Poll<Option<Result<Bytes, BodyError>>>> {
        let watch = &mut self.watch;
        let deadline = watch.last_frame + watch.idle;
        if watch.armed_for.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
            && watch.closing.as_ref().is_none_or(|c| !c.over.is_over())
            && watch.timer.as_ref().is_some_and(|t| !t.is_elapsed() && t.deadline() <= deadline)
        {
            return Some(Poll::Pending);
        }
        watch.armed_for = None;
        if watch.closing.as_mut().is_some_and(|c| c.wait.as_mut().poll(cx).is_ready()) {
            watch.closing = None;
            self.resume.resumes = 0;
            self.last = self.break_stream("tidegate is shutting down".into());
            return None;
        }
        // The timer is armed once and re-armed only when it fires early
        // (frames came meanwhile): not moved per event, which would cost a
        // timer-wheel update each.
        let timer = watch.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            // A continuation on an upstream with a shorter idle limit.
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            watch.armed_for = Some(cx.waker().clone());
            return Some(Poll::Pending);
        }
        if timer.deadline() < deadline {
            timer.as_mut().reset(deadline);
            if timer.as_mut().poll(cx).is_pending() {
                watch.armed_for = Some(cx.waker().clone());
                return Some(Poll::Pending);
            }
        }
        let idle = watch.idle;
        if self.source.scanner().is_some_and(|s| s.seen.complete) {
            self.inner = None;
            return None;
        }
        if self.source.sse().is_none() {
            self.inner = None;
            self.outcome = Some((Outcome::Incomplete, Some(format!("upstream silent for {idle:?}"))));
            self.end();
            return Some(Poll::Ready(Some(Err(BodyError::Idle(idle)))));
        }
        self.last = self.break_stream(format!("the upstream sent nothing for {idle:?}"));
        None
    }
}
