//! The connection to the shared store: one Redis or Valkey server
//! (`redis://`, `rediss://`, `valkey://`, `valkeys://`), or a Redis or
//! Valkey Cluster (`redis+cluster://host:port,host:port/`, or the
//! `valkey+`/`rediss+`/`valkeys+` forms), behind one type.
//!
//! In a cluster the client library follows MOVED/ASK redirections and
//! a failover (it reloads the slot map); every script's keys share the
//! upstream's hash tag (`tidegate:{name}:…`), so none crosses slots.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, PushInfo, RedisFuture, RedisResult, ToRedisArgs, Value};
use tokio::sync::mpsc;

use super::SharedError;

/// A store connection; cheap to clone (each clone shares the sockets).
#[derive(Clone)]
pub enum Conn {
    /// One server, reconnected by the connection manager.
    One(ConnectionManager),
    /// A cluster: one connection per node, routed by slot.
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects lazily to `url` (see the module docs); pushes (pub/sub
    /// messages, disconnections) go to `pushes`.
    pub fn open(url: &str, timeout: Duration, pushes: mpsc::UnboundedSender<PushInfo>) -> Result<Self, SharedError> {
        if let Some(seeds) = cluster_seeds(url)? {
            let client = ClusterClientBuilder::new(seeds)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(2)
                .push_sender(pushes)
                .build()
                .map_err(|e| SharedError(e.to_string()))?;
            let config =
                redis::cluster::ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
            return Ok(Conn::Cluster(client.get_pending_async_connection_with_config(config)));
        }
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| SharedError(e.to_string()))?;
        let settings = info.redis_settings().clone().set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings)).map_err(|e| SharedError(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1))
            .set_push_sender(pushes)
            .set_automatic_resubscription();
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| SharedError(e.to_string()))?;
        Ok(Conn::One(conn))
    }

    /// Whether this is a cluster (scripts that walk keys they cannot
    /// declare are done step by step there).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Subscribes to `channels` (messages arrive as pushes).
    pub async fn subscribe(&mut self, channels: impl ToRedisArgs) -> RedisResult<()> {
        match self {
            Conn::One(c) => c.subscribe(channels).await,
            Conn::Cluster(c) => c.subscribe(channels).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::One(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::One(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Whether `url` names a store tidegate can reach (see the module docs);
/// why not, in words that never repeat the URL (it may hold a password).
pub fn check_url(url: &str) -> Result<(), String> {
    if cluster_seeds(url).map_err(|e| e.0)?.is_some() {
        return Ok(());
    }
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "redis" | "rediss" | "valkey" | "valkeys") && u.host().is_some() => Ok(()),
        Ok(u) if matches!(u.scheme(), "redis" | "rediss" | "valkey" | "valkeys") => Err("no host".into()),
        Ok(u) => Err(format!("unknown scheme {}", u.scheme())),
        Err(_) => Err("not a URL".into()),
    }
}

/// A cluster URL's seed nodes as the client library takes them
/// (`redis://user:pass@host:port` each), `None` for a single server.
/// `redis+cluster://user:pass@h1:6379,h2:6379/`: the scheme before `+`
/// (`redis`, `rediss`, `valkey`, `valkeys`) and the credentials apply
/// to every node.
fn cluster_seeds(url: &str) -> Result<Option<Vec<String>>, SharedError> {
    let Some((scheme, rest)) = url.split_once("+cluster://") else { return Ok(None) };
    if !matches!(scheme, "redis" | "rediss" | "valkey" | "valkeys") {
        return Err(SharedError(format!("unknown store scheme {scheme}+cluster:// (redis, rediss, valkey, valkeys)")));
    }
    let rest = rest.split(['/', '?']).next().unwrap_or_default();
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let seeds: Vec<String> =
        hosts.split(',').map(str::trim).filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{auth}{h}")).collect();
    if seeds.is_empty() {
        return Err(SharedError("a cluster URL names no node: redis+cluster://host:port,host:port/".into()));
    }
    Ok(Some(seeds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_give_seed_nodes_with_the_credentials() {
        assert_eq!(cluster_seeds("redis://127.0.0.1:6379/0").unwrap(), None);
        assert_eq!(
            cluster_seeds("redis+cluster://u:p@a:7000,b:7001/").unwrap().unwrap(),
            ["redis://u:p@a:7000", "redis://u:p@b:7001"]
        );
        assert_eq!(cluster_seeds("valkeys+cluster://a:7000").unwrap().unwrap(), ["valkeys://a:7000"]);
        assert!(cluster_seeds("http+cluster://a:1").is_err());
        assert!(cluster_seeds("redis+cluster:///").is_err());
        assert!(check_url("redis+cluster://a:7000,b:7001/").is_ok());
        assert!(check_url("valkey://127.0.0.1:6379/0").is_ok());
        assert!(check_url("http://127.0.0.1").is_err());
        assert!(!check_url("redis://:sekrit@").unwrap_err().contains("sekrit"));
    }
}
