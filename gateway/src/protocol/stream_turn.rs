//! What every protocol's translated stream shares: a target protocol's
//! events read into [`Delta`]s ([`StreamReader`]), and deltas written as
//! a client protocol's events ([`StreamWriter`]). Each protocol's
//! `turn.rs` implements the part only it can say; the end of a stream —
//! its terminal events once, or its error event, and nothing after either
//! — and the tool calls a writer holds to say whole are the same for all,
//! written here once.

use bytes::{BufMut, BytesMut};

use super::turn::{Calls, Delta};
use super::{ErrorKind, Protocol, kind_of_status};

/// A target protocol's stream events into deltas.
pub trait StreamReader {
    /// Reads one event: its `event:` name (if any) and its joined data.
    fn read(&mut self, name: Option<&str>, data: &str, out: &mut Vec<Delta>);
}

/// Deltas into a client protocol's stream events.
pub trait StreamWriter {
    /// The client's protocol (whose error event a failure is told in).
    const PROTOCOL: Protocol;

    /// This protocol says a tool call in one piece, so the writer holds
    /// the calls ([`StreamWriter::calls`]) and writes them at the end.
    const HOLDS_CALLS: bool = false;

    /// Whether the stream has ended (its end or its error written):
    /// nothing is written after.
    fn ended(&mut self) -> &mut bool;

    /// The calls held, when [`StreamWriter::HOLDS_CALLS`].
    fn calls(&mut self) -> Option<&mut Calls> {
        None
    }

    /// Writes a delta that carries the answer (everything but its end,
    /// its failure and, for a writer that holds them, its tool calls).
    fn content(&mut self, delta: Delta, out: &mut BytesMut);

    /// Writes the protocol's terminal events (once: see
    /// [`StreamWriter::finish`]).
    fn end(&mut self, out: &mut BytesMut);

    /// Writes one delta.
    fn write(&mut self, delta: Delta, out: &mut BytesMut) {
        if *self.ended() {
            return;
        }
        match delta {
            Delta::Done => self.finish(out),
            Delta::Error { status, message } => self.fail(kind_of_status(status), &message, out),
            Delta::ToolCall { index, id, name } if Self::HOLDS_CALLS => {
                if let Some(calls) = self.calls() {
                    calls.open(index, id, name);
                }
            }
            Delta::ToolArgs { index, args } if Self::HOLDS_CALLS => {
                if let Some(calls) = self.calls() {
                    calls.args(index, &args);
                }
            }
            other => self.content(other, out),
        }
    }

    /// The client's terminal events, unless the stream has ended.
    fn finish(&mut self, out: &mut BytesMut) {
        if !*self.ended() {
            self.end(out);
            *self.ended() = true;
        }
    }

    /// A failure told in the client's protocol (its error event), unless
    /// the stream has ended; nothing is written after it.
    fn fail(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        if !*self.ended() {
            *self.ended() = true;
            out.put_slice(&Self::PROTOCOL.error_event(kind, message));
        }
    }
}
