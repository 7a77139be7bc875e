//! Azure OpenAI as an OpenAI upstream.
//!
//! Two URL styles: with an `api_version`, the deployment URLs
//! (`/openai/deployments/{deployment}/chat/completions?api-version=…`,
//! the deployment being the configured one or the model name sent);
//! without, the v1 API (`/openai/v1/chat/completions`, model in the body).
//! The key goes in the `api-key` header. Answers and errors are OpenAI's
//! shape already; `retry-after-ms` and `x-ratelimit-*` are read like
//! OpenAI's, and the content-filter refusal is a `400`, a request error.

use percent_encoding::utf8_percent_encode;

use super::PATH_LABEL;
use crate::config::AzureConfig;
use crate::protocol::Endpoint;

/// An Azure upstream's URL scheme.
pub struct Azure {
    config: AzureConfig,
}

impl Azure {
    /// From the validated config.
    pub fn new(config: &AzureConfig) -> Self {
        Self { config: config.clone() }
    }

    /// Path and query for `endpoint` with `model` sent.
    pub fn path(&self, endpoint: Endpoint, model: &str) -> String {
        let tail = endpoint.upstream_path();
        match &self.config.api_version {
            None => format!("/openai/v1{tail}"),
            Some(version) if endpoint == Endpoint::Responses => format!("/openai{tail}?api-version={version}"),
            Some(version) => {
                let deployment = self.config.deployment.as_deref().unwrap_or(model);
                format!(
                    "/openai/deployments/{}{tail}?api-version={version}",
                    utf8_percent_encode(deployment, PATH_LABEL)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_and_v1_urls() {
        let dated = Azure::new(&AzureConfig { api_version: Some("2024-10-21".into()), deployment: None });
        assert_eq!(
            dated.path(Endpoint::ChatCompletions, "gpt-4o prod"),
            "/openai/deployments/gpt-4o%20prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(dated.path(Endpoint::Responses, "x"), "/openai/responses?api-version=2024-10-21");
        let fixed = Azure::new(&AzureConfig { api_version: Some("v".into()), deployment: Some("emb".into()) });
        assert_eq!(fixed.path(Endpoint::Embeddings, "ignored"), "/openai/deployments/emb/embeddings?api-version=v");
        let v1 = Azure::new(&AzureConfig { api_version: None, deployment: None });
        assert_eq!(v1.path(Endpoint::ChatCompletions, "gpt-4o"), "/openai/v1/chat/completions");
    }
}
