//! The response body that ends a request: it owns the [`Exchange`] and is
//! in exactly one [`State`] at a time.
//!
//! ```text
//!  Waiting ──loop ends with a 2xx──► Relaying ◄──continuation──┐
//!     │                                 │  └──broke, may resume──► Reopening
//!     └──loop ends with a failure──► Last ──► Done ◄──────────┘ (ends)
//! ```
//!
//! *Waiting*: a streaming request that waited longer than
//! `stream_keepalive_after` got `200` and SSE headers; the attempt loop
//! keeps running here, and a comment line every few seconds says what it
//! waits for, so clients and proxies in between do not time out. Its end
//! is the upstream's events, or the failure as the protocol's error event.
//! *Relaying*: the upstream's answer ([`RelayBody`]). *Reopening*: a
//! broken stream being continued through the same attempt loop.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::{Exchange, Running};
use crate::protocol::Protocol;
use crate::record::Outcome;
use crate::relay::{Answer, progress::Progress};
use crate::stream::{BodyError, RelayBody};

/// Why the body failed mid-answer (the upstream's body broke).
pub type Error = BodyError;

/// A response body that owns its request (see the module doc).
pub struct ExchangeBody {
    state: State,
}

/// Where the body stands.
enum State {
    /// The attempt loop is still running after the headers went out.
    Waiting(Box<Waiting>),
    /// The upstream's answer is being relayed.
    Relaying { body: Box<RelayBody>, exchange: Exchange },
    /// A broken stream is being continued: a run of the attempt loop.
    Reopening { body: Box<RelayBody>, exchange: Exchange, running: Running },
    /// A last frame (the failure as the protocol's error event), then the
    /// end; the request is already reported.
    Last(Bytes),
    /// Over.
    Done,
}

/// A committed stream whose answer is still being fetched.
struct Waiting {
    exchange: Exchange,
    running: Running,
    tick: Pin<Box<Sleep>>,
    every: Duration,
    progress: Arc<Progress>,
    names: Arc<[String]>,
    protocol: Protocol,
}

impl ExchangeBody {
    /// Relays `body` (a 2xx answer) for `exchange`.
    pub fn relaying(exchange: Exchange, body: Box<RelayBody>) -> Self {
        Self { state: State::Relaying { body, exchange } }
    }

    /// Keeps a committed stream alive while `running` goes on, with a
    /// comment every `every`; `names` are upstream names for the comments.
    pub fn waiting(
        exchange: Exchange,
        running: Running,
        every: Duration,
        progress: Arc<Progress>,
        protocol: Protocol,
    ) -> Self {
        let names = exchange.sink.names.clone();
        let waiting = Waiting {
            exchange,
            running,
            tick: Box::pin(tokio::time::sleep(Duration::ZERO)),
            every,
            progress,
            names,
            protocol,
        };
        Self { state: State::Waiting(Box::new(waiting)) }
    }
}

impl Waiting {
    fn comment(&self) -> Bytes {
        let attempt = self.progress.attempts();
        let Some(upstream) = self.progress.upstream() else {
            // Nothing sent yet: queued, or held by a provider's Retry-After.
            return Bytes::from_static(": waiting for capacity — before the first attempt\n\n".as_bytes());
        };
        let upstream = self.names.get(upstream.index()).map_or("-", String::as_str);
        Bytes::from(format!(": waiting for capacity — attempt {attempt} on {upstream}\n\n"))
    }

    /// The loop ended: relay its stream, or end with its failure as the
    /// protocol's error event (headers are long gone).
    fn settle(self, answer: Answer) -> State {
        let Waiting { mut exchange, protocol, .. } = self;
        match answer {
            Answer::Stream(_, mut body) => {
                exchange.keep_for(&mut body);
                State::Relaying { body, exchange }
            }
            other => {
                let (event, class, message) = other.error_event_for(protocol, exchange.report.agent);
                exchange.report.class = class;
                exchange.report.error = Some(message);
                exchange.finish(Outcome::Failed);
                State::Last(event)
            }
        }
    }
}

impl Body for ExchangeBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let state = &mut self.state;
        loop {
            match state {
                State::Relaying { body, exchange } => {
                    let polled = Pin::new(&mut **body).poll_frame(cx);
                    if let Poll::Ready(Some(Ok(_))) = &polled {
                        exchange.first_byte();
                    }
                    // (A sized answer's end comes with its last bytes.)
                    if let Some(end) = body.take_end() {
                        exchange.ended(end);
                    }
                    match polled {
                        Poll::Ready(Some(Ok(frame))) => return Poll::Ready(Some(Ok(frame))),
                        Poll::Ready(None) => {
                            if let Some(ask) = body.asked()
                                && let Some(running) = exchange.reopen(ask.text)
                            {
                                exchange.report.attempts.push(ask.log);
                                let State::Relaying { body, exchange } = std::mem::replace(state, State::Done) else {
                                    return Poll::Ready(None);
                                };
                                *state = State::Reopening { body, exchange, running };
                                continue;
                            }
                            if body.asked().is_some() {
                                // The protocol cannot continue it: it ends
                                // with its error event.
                                body.not_continued(None);
                                continue;
                            }
                            *state = State::Done;
                            return Poll::Ready(None);
                        }
                        Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                State::Reopening { running, .. } => {
                    let ran = match running.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(ran) => ran,
                    };
                    let State::Reopening { mut body, mut exchange, .. } = std::mem::replace(state, State::Done) else {
                        return Poll::Ready(None);
                    };
                    match exchange.reopened(ran) {
                        Ok(reopened) => body.continue_with(reopened),
                        // A continuation that failed is not chained with another.
                        Err(error) => body.not_continued(Some(&error.to_string())),
                    }
                    *state = State::Relaying { body, exchange };
                }
                State::Waiting(waiting) => {
                    if let Poll::Ready(ran) = waiting.running.as_mut().poll(cx) {
                        let State::Waiting(mut waiting) = std::mem::replace(state, State::Done) else {
                            return Poll::Ready(None);
                        };
                        let answer = waiting.exchange.absorb(ran);
                        *state = waiting.settle(answer);
                        continue;
                    }
                    if waiting.tick.as_mut().poll(cx).is_ready() {
                        let next = tokio::time::Instant::now() + waiting.every;
                        waiting.tick.as_mut().reset(next);
                        return Poll::Ready(Some(Ok(Frame::data(waiting.comment()))));
                    }
                    return Poll::Pending;
                }
                State::Last(_) => {
                    let State::Last(last) = std::mem::replace(state, State::Done) else { return Poll::Ready(None) };
                    return Poll::Ready(Some(Ok(Frame::data(last))));
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never claim the end early: the end is where the request is
        // reported.
        false
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Relaying { body, .. } => body.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for ExchangeBody {
    fn drop(&mut self) {
        // Dropped before the end: the client went away mid-answer; the
        // exchange's own drop records it as cancelled, with what was sent.
        if let State::Relaying { body, exchange } | State::Reopening { body, exchange, .. } = &mut self.state {
            let (usage, partial) = body.cut();
            exchange.cut(usage, partial);
        }
    }
}
