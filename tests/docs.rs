//! The README's config reference covers every config field: a field added
//! to `gateway/src/config/raw.rs` without documentation fails here.

#[test]
fn every_config_field_is_in_the_readme() {
    let raw =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway/src/config/raw.rs")).unwrap_or_default();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap_or_default();
    let fields: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(fields.len() > 30, "parsed too few fields: {fields:?}");
    let missing: Vec<&&str> = fields
        .iter()
        .filter(|f| {
            !readme.contains(&format!("`{f}`"))
                && !readme.contains(&format!(".{f}`"))
                && !readme.contains(&format!("`{f}."))
        })
        .filter(|f| !readme.contains(&format!("[].{f}`")))
        .collect();
    assert!(missing.is_empty(), "config fields missing from the README's config reference: {missing:?}");
}

/// The worked example of "Sharing capacity between clients" is a valid
/// config as written.
#[test]
fn the_lanes_example_is_a_valid_config() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap_or_default();
    let section = readme.split("## Sharing capacity between clients").nth(1).unwrap_or_default();
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap_or_default();
    assert!(block.contains("nightly-evals"), "example not found");
    let config = tidegate::config::Config::parse(block, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("the README's lanes example is invalid: {e}"));
    let nightly = config.client_keys.iter().find(|k| k.name == "nightly-evals").map(|k| &k.lane);
    assert!(nightly.is_some_and(|l| l.priority.as_str() == "batch" && l.models.len() == 1));
}

/// The example of "Cloud upstreams" is a valid config as written (its key
/// file path pointed at a real key file), with one upstream of each kind.
#[test]
fn the_cloud_upstreams_example_is_a_valid_config() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap_or_default();
    let section = readme.split("## Cloud upstreams").nth(1).unwrap_or_default();
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap_or_default();
    assert!(block.contains("kind: bedrock"), "example not found");
    let dir = std::env::temp_dir().join(format!("tidegate-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    let key_file = dir.join("vertex-sa.json");
    let key = serde_json::json!({"type": "service_account", "client_email": "a@b.iam", "private_key": "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n", "token_uri": "https://oauth2.googleapis.com/token"});
    std::fs::write(&key_file, key.to_string()).unwrap_or_default();
    let block = block.replace("/etc/tidegate/vertex-sa.json", &key_file.display().to_string());
    let config = tidegate::config::Config::parse(&block, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("the README's cloud example is invalid: {e}"));
    let kinds: Vec<&str> = config.upstreams.iter().map(|u| u.kind.as_str()).collect();
    assert_eq!(kinds, ["direct", "bedrock", "vertex", "direct", "azure"]);
    assert_eq!(config.upstreams[1].base_url.as_str(), "https://bedrock-runtime.us-east-1.amazonaws.com/");
    assert_eq!(config.upstreams[2].base_url.as_str(), "https://europe-west1-aiplatform.googleapis.com/");
    assert_eq!(config.models["claude-sonnet-4"].targets.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
