//! Routing: from an admitted request to the [`Job`] the attempt loop
//! sends — which alias or pattern the model names, which of its targets
//! serve the endpoint, the deadline, the priority, a pin to the upstream
//! that stores the state it continues, and the key's lane.
//!
//! Everything here is tidegate's own decision about the request; an
//! error is tidegate's answer ([`GatewayError`]), before any attempt.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use tokio::time::Instant;

use crate::config::{ModelRoute, Target};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::headers;
use crate::ids::UpstreamId;
use crate::limits::Priority;
use crate::protocol::{self, Endpoint};
use crate::relay::Job;

/// What routing learned of a request, refused or not, for its owner's
/// record: the model asked (a configured alias as the config's shared
/// string), whether it streams, its protocol, its trace.
#[derive(Debug, Default)]
pub struct Asked {
    /// The model asked for.
    pub model: Option<Arc<str>>,
    /// The client asked for SSE.
    pub stream: bool,
    /// The client's protocol.
    pub protocol: Option<protocol::Protocol>,
    /// Its trace, when `otel` is configured.
    pub trace: Option<Arc<crate::otel::TraceCtx>>,
}

/// Routes an admitted request (`body`, the client's `headers`) of the
/// key named `client`, arrived at `started`, asked on `endpoint`, for the
/// model `named` in its path (Gemini) or else in its body; says in
/// `asked` what it learned on the way, whether it routes the request or
/// refuses it.
#[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
#[expect(clippy::too_many_arguments, reason = "the request's parts, each moved in once")]
pub fn route<'a>(
    gw: &'a Arc<Gateway>,
    endpoint: Endpoint,
    named: Option<String>,
    headers: HeaderMap,
    body: Bytes,
    client: Option<&'a str>,
    started: Instant,
    asked: &'a mut Asked,
) -> impl Future<Output = Result<Routed, GatewayError>> + Send + 'a {
    // Not an `async fn`: it would keep the headers and the body twice in
    // the request's future.
    async move {
        let head = match &named {
            Some(model) => protocol::gemini::peek(&body, model, endpoint == Endpoint::StreamGenerateContent),
            None => protocol::peek(&body),
        };
        let head = head.map_err(|e| GatewayError::BadRequest(e.to_string()))?;
        asked.stream = head.stream;
        asked.protocol = Some(endpoint.protocol());
        let found = gw.config.find_route(&head.model);
        // A configured alias is recorded as the config's shared string; a name
        // a pattern matched, as asked.
        asked.model = Some(
            match found.and_then(|(i, _)| gw.aliases.get(i.index())).filter(|a| a.as_ref() == head.model.as_str()) {
                Some(alias) => alias.clone(),
                None => Arc::from(head.model.as_str()),
            },
        );
        let family = endpoint.protocol().family();
        let Some((route, model)) = found else { return Err(unknown(gw, &head.model)) };
        let way = |t: &Target| gw.upstreams.get(t.upstream).and_then(|u| u.way(endpoint, t.translate));
        let serving = |t: &Target| way(t).is_some();
        if endpoint.counts_tokens() && !model.targets.iter().any(serving) {
            // No target of its protocol to count them: an estimate, said to be one.
            return crate::translate::estimate_tokens(endpoint.protocol(), &body)
                .map(Routed::Estimate)
                .map_err(|why| GatewayError::BadRequest(format!("count_tokens: {why}")));
        }
        if !model.targets.iter().any(serving) {
            return Err(unserved(gw, endpoint, &head.model, model));
        }
        // The key's own deadline (an agent's minutes, a chat app's
        // seconds) over the alias's.
        let lane = client.and_then(|name| gw.lanes.get(name)).cloned();
        let base = match &lane {
            Some(lane) => lane.deadline(),
            None => gw.config.client_deadline,
        };
        // tidegate's own headers are looked up only when there are any.
        let own = headers::any_own(&headers);
        let deadline = deadline(base.unwrap_or(model.deadline), own.then_some(&headers), started)?;
        // Whose what this request continues or makes tidegate keep is.
        let owner: crate::kept::Owner = lane.as_ref().map(|l| l.owner().clone());
        let pin = match &head.previous_response_id {
            Some(id) => continued(gw, &owner, id, model, &way).await?,
            None => None,
        };
        let priority = match own.then(|| headers.get(headers::PRIORITY)).flatten() {
            None => None,
            Some(v) => Some(priority(v)?),
        };
        let trace = gw
            .sink
            .tracer
            .as_ref()
            .map(|_| Arc::new(crate::otel::TraceCtx::start(&headers, endpoint.operation(), family.as_str())));
        asked.trace = trace.clone();
        let who = match &lane {
            Some(lane) => lane.who(priority, started),
            None => gw.lanes.anonymous(priority.unwrap_or_default()),
        };
        // A conversation over several targets goes back where its prompt
        // is cached (a request pinned to stored state goes there anyway).
        let session = match (&pin, model.affinity && model.targets.len() > 1) {
            (None, true) => session(gw, &owner, &headers, &body).await,
            _ => None,
        };
        Ok(Routed::Relay(Job {
            gw: gw.clone(),
            endpoint,
            route,
            chained: own && headers.contains_key(headers::HOP),
            head,
            body,
            client_headers: unpinned(headers),
            deadline,
            progress: Arc::default(),
            who,
            lane,
            trace,
            pin,
            session,
            owner,
        }))
    }
}

/// The request's conversation and the target its prompt cache is bound
/// to, if anything identifies a conversation.
async fn session(
    gw: &Gateway,
    owner: &crate::kept::Owner,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Arc<crate::affinity::Session>> {
    let key = crate::affinity::session_key(headers, body)?;
    let bound = gw.sessions.find(owner, &key).await;
    let moving_cost = crate::affinity::moving_cost(body.len());
    Some(Arc::new(crate::affinity::Session { key, bound, moving_cost }))
}

/// A model no alias or pattern names: the aliases there are.
fn unknown(gw: &Gateway, asked: &str) -> GatewayError {
    let known: Vec<&str> = gw.config.aliases().collect();
    GatewayError::UnknownModel(format!(
        "model {asked:?} is not configured on this gateway; available: {}",
        if known.is_empty() { "(none)".to_string() } else { known.join(", ") }
    ))
}

/// No target of `model` (the alias `asked`) serves `endpoint`: why, in
/// the upstreams' kinds.
fn unserved(gw: &Gateway, endpoint: Endpoint, asked: &str, model: &ModelRoute) -> GatewayError {
    let kinds: Vec<&str> =
        model.targets.iter().filter_map(|t| gw.upstreams.get(t.upstream)).map(|u| u.kind_name()).collect();
    let why = if endpoint.translatable() {
        "each says translate: false, and none speaks this protocol"
    } else {
        "this endpoint is served only by upstreams of its own protocol (it is not translated)"
    };
    GatewayError::UnknownModel(format!(
        "model {asked:?} has no target that serves {endpoint} (its upstreams are {}: {why})",
        kinds.join(", ")
    ))
}

/// The priority a client asked for (`x-tidegate-priority`).
fn priority(v: &HeaderValue) -> Result<Priority, GatewayError> {
    Priority::parse(v.to_str().unwrap_or_default()).ok_or_else(|| {
        GatewayError::BadRequest(format!(
            "{}: {:?} is not a priority (interactive or batch)",
            headers::PRIORITY,
            String::from_utf8_lossy(v.as_bytes())
        ))
    })
}

/// Where routing sends a request.
#[expect(
    clippy::large_enum_variant,
    reason = "moved once and matched at once; boxing the job would allocate for every request"
)]
pub enum Routed {
    /// To the attempt loop.
    Relay(Job),
    /// Answered here: a `count_tokens` estimate (the input tokens) for an
    /// alias with no target that counts them.
    Estimate(u64),
}

/// The client's headers with their values copied out of hyper's read
/// buffer. Parsed values are slices of that buffer; a request keeps its
/// headers and body to its end (retries resend them), and a buffer still
/// referenced cannot be reused in place: hyper's read for a client hanging
/// up mid-request then allocates a fresh one, and each request in flight
/// holds two. A few small copies cost less (peak RSS with 1000 requests in
/// flight −3 MiB, throughput unchanged: `bench/core.sh`). The values are
/// copied into one buffer that each new value is a slice of (one
/// allocation for all of them), and replaced in place: the map, its names
/// and their hashes stay as parsed.
fn unpinned(mut headers: HeaderMap) -> HeaderMap {
    let mut copy = bytes::BytesMut::with_capacity(headers.values().map(|v| v.len()).sum());
    for value in headers.values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let end = at + value.len();
        // The same bytes, so still a valid value; `sensitive` is kept.
        let sensitive = value.is_sensitive();
        if let Ok(mut v) = HeaderValue::from_maybe_shared(copy.slice(at..end)) {
            v.set_sensitive(sensitive);
            *value = v;
        }
        at = end;
    }
    headers
}

/// Where a request continuing response `id` (`previous_response_id`) for
/// `owner` goes: the upstream that stores it, which it must go to; else,
/// for a translated target, the conversation tidegate kept (read back from
/// another replica now, as the attempt loop's translation does not wait).
/// An id neither knows is refused before any attempt, as the provider
/// refuses an id it does not have — except without client keys on a
/// target that stores state itself, which then says whether it has it
/// (with client keys, the provider behind tidegate's one key would answer
/// for any client's id).
async fn continued(
    gw: &Gateway,
    owner: &crate::kept::Owner,
    id: &str,
    route: &ModelRoute,
    way: &impl Fn(&Target) -> Option<protocol::Way>,
) -> Result<Option<UpstreamId>, GatewayError> {
    if let Some(upstream) = pinned(gw, owner, id, route).await? {
        return Ok(Some(upstream));
    }
    let translated = route.targets.iter().any(|t| way(t).is_some_and(|w| w != protocol::Way::Native));
    if translated && gw.kept.fetch(id, owner).await {
        return Ok(None);
    }
    let native = route.targets.iter().any(|t| way(t) == Some(protocol::Way::Native));
    if native && owner.is_none() {
        return Ok(None);
    }
    Err(GatewayError::PreviousResponseNotFound(id.to_owned()))
}

/// The upstream that stores `owner`'s response `id`, if it is known.
async fn pinned(
    gw: &Gateway,
    owner: &crate::kept::Owner,
    id: &str,
    route: &ModelRoute,
) -> Result<Option<UpstreamId>, GatewayError> {
    let Some(upstream) = gw.pins.find(owner, id).await else { return Ok(None) };
    if route.targets.iter().any(|t| t.upstream == upstream) {
        return Ok(Some(upstream));
    }
    let name = gw.sink.names.get(upstream.index()).map_or("?", String::as_str);
    Err(GatewayError::BadRequest(format!(
        "previous_response_id {id:?} is stored at upstream {name}, which this model does not route to; \
         ask the model that produced it"
    )))
}

/// The request's deadline: the alias's, shortened (never lengthened) by a
/// client's `x-tidegate-deadline: 30s` (`headers`: the client's, when it
/// sent any of tidegate's own).
fn deadline(route_deadline: Duration, headers: Option<&HeaderMap>, arrived: Instant) -> Result<Instant, GatewayError> {
    let asked = match headers.and_then(|h| h.get(headers::DEADLINE)) {
        None => None,
        Some(v) => {
            let text = v.to_str().unwrap_or_default().trim();
            match humantime::parse_duration(text) {
                Ok(d) => Some(d),
                Err(_) => return Err(GatewayError::BadDeadline(text.to_string())),
            }
        }
    };
    let budget = asked.map_or(route_deadline, |d| d.min(route_deadline));
    Ok(arrived + budget)
}
