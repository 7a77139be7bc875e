//! `kind:` of an upstream: how tidegate reaches it.
//!
//! `protocol` says what the client speaks and what the answers look like;
//! `kind` says where the request goes and how it is signed. The same Claude
//! model is reached through Anthropic's API, Amazon Bedrock or Google
//! Vertex AI, the same GPT model through OpenAI or Azure OpenAI, so one
//! alias can fail over between them with the client noticing nothing.
//! Each kind has its own fields (region, project, credentials, deployment,
//! api-version); a field set on a kind it does not apply to is an error,
//! like a misspelt one.

use std::path::PathBuf;

use super::Secret;
use super::raw::RawUpstream;
use crate::protocol::Family;

/// How an upstream is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamKind {
    /// The provider's own API (`openai`, `anthropic`, or anything speaking
    /// them): `base_url` + the endpoint's path, `api_key` in the
    /// protocol's header.
    Direct,
    /// Amazon Bedrock (Anthropic models): `/model/{id}/invoke`, AWS
    /// Signature V4, event-stream framing for streams.
    Bedrock(BedrockConfig),
    /// Google Vertex AI (Anthropic models): `…/publishers/anthropic/models/
    /// {model}:rawPredict`, an OAuth access token.
    Vertex(VertexConfig),
    /// Azure OpenAI: deployment URLs with `api-version` (or the v1 path),
    /// `api-key` header.
    Azure(AzureConfig),
}

impl UpstreamKind {
    /// Its name in the config (and in traces and `/admin`).
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamKind::Direct => "direct",
            UpstreamKind::Bedrock(_) => "bedrock",
            UpstreamKind::Vertex(_) => "vertex",
            UpstreamKind::Azure(_) => "azure",
        }
    }
}

/// `kind: bedrock`.
#[derive(Debug, Clone, PartialEq)]
pub struct BedrockConfig {
    /// AWS region (`us-east-1`): part of the signature and the default URL.
    pub region: String,
    /// Access key id (treated as a secret: it names the account).
    pub access_key_id: Secret,
    /// Secret access key.
    pub secret_access_key: Secret,
    /// Session token of temporary credentials.
    pub session_token: Option<Secret>,
}

/// `kind: vertex`.
#[derive(Debug, Clone, PartialEq)]
pub struct VertexConfig {
    /// Region (`us-east5`, `europe-west1`, or `global`).
    pub region: String,
    /// Google Cloud project id.
    pub project: String,
    /// Where access tokens come from.
    pub auth: GoogleAuth,
}

/// Where a Vertex upstream's OAuth access tokens come from.
#[derive(Debug, Clone, PartialEq)]
pub enum GoogleAuth {
    /// A service-account key file: a signed JWT exchanged at the file's
    /// `token_uri` for a token, cached and refreshed before it expires.
    KeyFile(PathBuf),
    /// A command printing a token (e.g. `gcloud auth print-access-token`),
    /// run again when the token is older than `token_command_ttl`.
    Command {
        /// The command line (run by `sh -c`).
        command: String,
        /// How long one token is used.
        ttl: std::time::Duration,
    },
    /// Application default credentials: `GOOGLE_APPLICATION_CREDENTIALS`,
    /// gcloud's user login, or the metadata server on Google Cloud.
    Default,
}

/// `kind: azure`.
#[derive(Debug, Clone, PartialEq)]
pub struct AzureConfig {
    /// `api-version` query parameter; `None`: the v1 API
    /// (`/openai/v1/...`, model in the body).
    pub api_version: Option<String>,
    /// Deployment to call; `None`: the model name sent (targets name their
    /// deployment as `model`).
    pub deployment: Option<String>,
}

/// How long a token printed by `token_command` is used by default
/// (Google's access tokens live an hour).
const DEFAULT_TOKEN_COMMAND_TTL: std::time::Duration = std::time::Duration::from_secs(45 * 60);

/// The kind-specific fields of one upstream, validated: its protocol, its
/// kind and its base URL (`None`: the kind has none by default and the
/// config gave none). Problems are pushed with their field paths.
pub(super) fn kind(
    i: usize,
    u: &RawUpstream,
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> Option<(Family, UpstreamKind, Option<String>)> {
    let at = |field: &str| format!("upstreams[{i}].{field}");
    let before = problems.len();
    let written = u.kind.as_deref().or(u.protocol.as_deref());
    let implied = match written {
        Some("openai") | Some("azure") => Some(Family::OpenAi),
        Some("openai-chat") if u.kind.is_none() => Some(Family::OpenAiChat),
        Some("gemini") if u.kind.is_none() => Some(Family::Gemini),
        // Vertex serves Claude (Anthropic messages) and Gemini models.
        Some("vertex") if u.protocol.as_deref() == Some("gemini") => Some(Family::Gemini),
        Some("anthropic") | Some("bedrock") | Some("vertex") => Some(Family::Anthropic),
        Some(other) => {
            let field = if u.kind.is_some() { "kind" } else { "protocol" };
            let choices = if u.kind.is_some() {
                "anthropic, bedrock, vertex, openai, azure"
            } else {
                "openai, openai-chat, anthropic, gemini"
            };
            problems.push(format!("{}: {other:?} is not one of {choices}", at(field)));
            None
        }
        None => {
            problems
                .push(format!("{}: missing (openai, openai-chat, anthropic or gemini; or set kind)", at("protocol")));
            None
        }
    };
    let protocol = match (u.protocol.as_deref(), implied) {
        (Some("openai-chat"), Some(Family::OpenAi | Family::OpenAiChat))
            if u.kind.as_deref().is_none_or(|k| k == "openai") =>
        {
            Some(Family::OpenAiChat)
        }
        (Some(p), Some(family)) if p != family.as_str() => {
            if matches!(p, "openai" | "openai-chat" | "anthropic" | "gemini") {
                problems.push(format!(
                    "{}: kind {} speaks {family}, not {p}",
                    at("protocol"),
                    u.kind.as_deref().unwrap_or_default()
                ));
            } else {
                problems
                    .push(format!("{}: {p:?} is not one of openai, openai-chat, anthropic, gemini", at("protocol")));
            }
            None
        }
        (_, family) => family,
    };
    let name = u.kind.as_deref().unwrap_or("direct");
    // Fields that belong to other kinds are mistakes, not silent no-ops.
    let mut foreign = |field: &str, set: bool, kinds: &str| {
        if set {
            problems.push(format!("{}: only applies to kind {kinds} (this upstream is {name})", at(field)));
        }
    };
    let aws = matches!(name, "bedrock");
    let google = matches!(name, "vertex");
    let azure = matches!(name, "azure");
    foreign("region", u.region.is_some() && !(aws || google), "bedrock or vertex");
    foreign("aws_access_key_id", u.aws_access_key_id.is_some() && !aws, "bedrock");
    foreign("aws_secret_access_key", u.aws_secret_access_key.is_some() && !aws, "bedrock");
    foreign("aws_session_token", u.aws_session_token.is_some() && !aws, "bedrock");
    foreign("project", u.project.is_some() && !google, "vertex");
    foreign("credentials_file", u.credentials_file.is_some() && !google, "vertex");
    foreign("token_command", u.token_command.is_some() && !google, "vertex");
    foreign("token_command_ttl", u.token_command_ttl.is_some() && !google, "vertex");
    foreign("api_version", u.api_version.is_some() && !azure, "azure");
    foreign("deployment", u.deployment.is_some() && !azure, "azure");
    if (aws || google) && !u.api_key.is_empty() {
        problems.push(format!(
            "{}: {name} upstreams are not reached with an api_key ({})",
            at("api_key"),
            if aws {
                "set aws_access_key_id and aws_secret_access_key"
            } else {
                "set credentials_file or token_command"
            }
        ));
    }
    let text = |field: &str, value: &Option<String>, problems: &mut Vec<String>| -> Option<String> {
        match value.as_deref().map(str::trim) {
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()) => Some(v.to_owned()),
            Some(_) => {
                problems.push(format!("{}: must be a non-empty word (no spaces)", at(field)));
                None
            }
            None => None,
        }
    };
    let kind = match name {
        "bedrock" => {
            let region = text("region", &u.region, problems)
                .or_else(|| lookup("AWS_REGION"))
                .or_else(|| lookup("AWS_DEFAULT_REGION"));
            let key_id = u.aws_access_key_id.clone().or_else(|| lookup("AWS_ACCESS_KEY_ID"));
            let secret = u.aws_secret_access_key.clone().or_else(|| lookup("AWS_SECRET_ACCESS_KEY"));
            // A session token only goes with the key it was issued for.
            let token = if u.aws_access_key_id.is_some() {
                u.aws_session_token.clone()
            } else {
                u.aws_session_token.clone().or_else(|| lookup("AWS_SESSION_TOKEN"))
            };
            if region.is_none() && u.region.is_none() {
                problems.push(format!("{}: missing (or set AWS_REGION)", at("region")));
            }
            for (field, value, env) in [
                ("aws_access_key_id", &key_id, "AWS_ACCESS_KEY_ID"),
                ("aws_secret_access_key", &secret, "AWS_SECRET_ACCESS_KEY"),
            ] {
                match value.as_deref() {
                    None | Some("") => problems.push(format!("{}: missing (or set {env})", at(field))),
                    Some(v) if !v.bytes().all(|b| b.is_ascii_graphic()) => {
                        problems.push(format!("{}: holds spaces or control characters", at(field)))
                    }
                    Some(_) => {}
                }
            }
            UpstreamKind::Bedrock(BedrockConfig {
                region: region.unwrap_or_default(),
                access_key_id: Secret::new(key_id.unwrap_or_default()),
                secret_access_key: Secret::new(secret.unwrap_or_default()),
                session_token: token.filter(|t| !t.is_empty()).map(Secret::new),
            })
        }
        "vertex" => {
            let region = text("region", &u.region, problems);
            let project = text("project", &u.project, problems);
            if u.region.is_none() {
                problems.push(format!("{}: missing (us-east5, europe-west1, global, ...)", at("region")));
            }
            if u.project.is_none() {
                problems.push(format!("{}: missing (the Google Cloud project id)", at("project")));
            }
            let ttl = super::fields::duration(
                &at("token_command_ttl"),
                &u.token_command_ttl,
                DEFAULT_TOKEN_COMMAND_TTL,
                problems,
            );
            let auth = match (&u.credentials_file, &u.token_command) {
                (Some(_), Some(_)) => {
                    problems.push(format!("{}: set credentials_file or token_command, not both", at("token_command")));
                    GoogleAuth::Default
                }
                (Some(file), None) => {
                    let path = PathBuf::from(file);
                    if let Err(problem) = check_key_file(&path) {
                        problems.push(format!("{}: {problem}", at("credentials_file")));
                    }
                    GoogleAuth::KeyFile(path)
                }
                (None, Some(command)) if command.trim().is_empty() => {
                    problems.push(format!("{}: must not be empty", at("token_command")));
                    GoogleAuth::Default
                }
                (None, Some(command)) => GoogleAuth::Command { command: command.clone(), ttl },
                (None, None) => GoogleAuth::Default,
            };
            UpstreamKind::Vertex(VertexConfig {
                region: region.unwrap_or_default(),
                project: project.unwrap_or_default(),
                auth,
            })
        }
        "azure" => {
            let api_version = text("api_version", &u.api_version, problems).filter(|v| v != "v1");
            let deployment = text("deployment", &u.deployment, problems);
            if u.base_url.is_none() {
                problems.push(format!("{}: missing (https://<resource>.openai.azure.com)", at("base_url")));
            }
            UpstreamKind::Azure(AzureConfig { api_version, deployment })
        }
        // Google AI Studio has one address.
        _ if implied == Some(Family::Gemini) => UpstreamKind::Direct,
        _ => {
            if u.base_url.is_none() && implied.is_some() {
                problems.push(format!("{}: missing", at("base_url")));
            }
            UpstreamKind::Direct
        }
    };
    let base_url = u.base_url.clone().or_else(|| match (&kind, implied) {
        (UpstreamKind::Direct, Some(Family::Gemini)) => Some(GOOGLE_AI_STUDIO.to_owned()),
        _ => default_base_url(&kind),
    });
    (problems.len() == before).then_some((protocol?, kind, base_url))
}

/// Google AI Studio's address (the Gemini API), the default `base_url` of
/// a `protocol: gemini` upstream.
pub const GOOGLE_AI_STUDIO: &str = "https://generativelanguage.googleapis.com";

/// The provider's own endpoint for a cloud kind, when `base_url` is not
/// given (it is given for VPC endpoints, proxies and the simulator).
fn default_base_url(kind: &UpstreamKind) -> Option<String> {
    match kind {
        UpstreamKind::Bedrock(b) => Some(format!("https://bedrock-runtime.{}.amazonaws.com", b.region)),
        UpstreamKind::Vertex(v) if v.region == "global" => Some("https://aiplatform.googleapis.com".into()),
        UpstreamKind::Vertex(v) => Some(format!("https://{}-aiplatform.googleapis.com", v.region)),
        UpstreamKind::Direct | UpstreamKind::Azure(_) => None,
    }
}

/// A service-account key file must exist and say what a token exchange
/// needs; checked at load so `tidegate check` finds a wrong path, not the
/// first request.
fn check_key_file(path: &std::path::Path) -> Result<(), super::Problem> {
    let text =
        std::fs::read_to_string(path).map_err(|e| super::Problem(format!("cannot read {}: {e}", path.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| super::Problem(format!("{} is not a JSON key file", path.display())))?;
    for field in ["client_email", "private_key", "token_uri"] {
        if !json.get(field).is_some_and(serde_json::Value::is_string) {
            return Err(super::Problem(format!("{} has no {field} (is it a service-account key?)", path.display())));
        }
    }
    Ok(())
}
