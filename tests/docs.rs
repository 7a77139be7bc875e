//! The manual (`docs/src/`, an mdBook) and the README hold what they say:
//! the configuration reference covers every config field (a field added
//! to `gateway/src/config/raw.rs` without documentation fails here), the
//! worked examples are valid configs as written, and every page and link
//! points at a file that exists.

/// A file of the repository, as text.
fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_default()
}

#[test]
fn every_config_field_is_in_the_readme() {
    let raw =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway/src/config/raw.rs")).unwrap_or_default();
    let readme = read("docs/src/configuration.md");
    assert!(readme.contains("# Config reference"), "the configuration page is where SUMMARY.md says");
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
    assert!(missing.is_empty(), "config fields missing from docs/src/configuration.md: {missing:?}");
}

/// The worked example of "Sharing capacity between clients" is a valid
/// config as written.
#[test]
fn the_lanes_example_is_a_valid_config() {
    let section = read("docs/src/lanes.md");
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap_or_default();
    assert!(block.contains("nightly-evals"), "example not found");
    let config = tidegate::config::Config::parse(block, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("docs/src/lanes.md's example is invalid: {e}"));
    let nightly = config.client_keys.iter().find(|k| k.name == "nightly-evals").map(|k| &k.lane);
    assert!(nightly.is_some_and(|l| l.priority.as_str() == "batch" && l.models.len() == 1));
}

/// The example of "Cloud upstreams" is a valid config as written (its key
/// file path pointed at a real key file), with one upstream of each kind.
#[test]
fn the_cloud_upstreams_example_is_a_valid_config() {
    let section = read("docs/src/clouds.md");
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap_or_default();
    assert!(block.contains("kind: bedrock"), "example not found");
    let dir = std::env::temp_dir().join(format!("tidegate-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    let key_file = dir.join("vertex-sa.json");
    let key = serde_json::json!({"type": "service_account", "client_email": "a@b.iam", "private_key": "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n", "token_uri": "https://oauth2.googleapis.com/token"});
    std::fs::write(&key_file, key.to_string()).unwrap_or_default();
    let block = block.replace("/etc/tidegate/vertex-sa.json", &key_file.display().to_string());
    let config = tidegate::config::Config::parse(&block, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("docs/src/clouds.md's example is invalid: {e}"));
    let kinds: Vec<&str> = config.upstreams.iter().map(|u| u.kind.as_str()).collect();
    assert_eq!(kinds, ["direct", "bedrock", "vertex", "direct", "azure"]);
    assert_eq!(config.upstreams[1].base_url.as_str(), "https://bedrock-runtime.us-east-1.amazonaws.com/");
    assert_eq!(config.upstreams[2].base_url.as_str(), "https://europe-west1-aiplatform.googleapis.com/");
    assert_eq!(config.models["claude-sonnet-4"].targets.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The examples of "Limits learned from every answer" are valid as
/// written: the pool (with `pick` and `reserve`) and the simulator config.
#[test]
fn the_learned_limits_examples_are_valid() {
    let page = read("docs/src/learned-limits.md");
    let mut blocks = page.split("```yaml\n").skip(1).filter_map(|b| b.split("```").next());
    let pool = blocks.next().unwrap_or_default();
    assert!(pool.contains("reset-first"), "example not found");
    let config = tidegate::config::Config::parse(pool, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("docs/src/learned-limits.md's pool is invalid: {e}"));
    let member = config.upstreams[0].pool.as_ref().expect("a pool");
    assert_eq!((member.pick, member.reserve), (tidegate::config::PoolPick::ResetFirst, Some(0.9)));
    let sim = blocks.next().unwrap_or_default();
    let sim = tidegate_simulate::SimConfig::from_yaml(sim);
    let sim = sim.unwrap_or_else(|e| panic!("docs/src/learned-limits.md's simulator config is invalid: {e}"));
    assert!(sim.advertise.is_some() && sim.accounts["key-a"].windows.is_some());
}

/// The README's minimal config is a valid config as written.
#[test]
fn the_readmes_config_is_valid() {
    let readme = read("README.md");
    let section = readme.split("## Run it for real").nth(1).unwrap_or_default();
    let block = section.split("```yaml\n").nth(1).and_then(|b| b.split("```").next()).unwrap_or_default();
    assert!(block.contains("TM.00001041"), "example not found");
    let config = tidegate::config::Config::parse(block, &|name| Some(format!("value-of-{name}")));
    let config = config.unwrap_or_else(|e| panic!("the README's config is invalid: {e}"));
    assert_eq!(config.models["glm"].targets.len(), 2);
}

/// Relative links (`[x](path)`) of `text`, a file in `dir`, without their
/// `#anchor`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with('#') && !target.contains(' ') && !target.is_empty() {
            out.push(target.split('#').next().unwrap_or_default().to_owned());
        }
    }
    out
}

/// The book's every page is in its SUMMARY.md and every page SUMMARY.md
/// names exists; the README's, ARCHITECTURE.md's and the book's relative
/// links point at files that exist; the README stays a page a newcomer
/// reads (its first lines are the two commands; it is not the manual).
#[test]
fn the_book_and_the_readme_hold_together() {
    let root = env!("CARGO_MANIFEST_DIR");
    let summary = read("docs/src/SUMMARY.md");
    let named = links(&summary);
    let pages: Vec<String> = std::fs::read_dir(format!("{root}/docs/src"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    for page in &pages {
        assert!(named.contains(page), "docs/src/{page} is not in SUMMARY.md");
    }
    for (file, dir) in
        [("README.md", ""), ("ARCHITECTURE.md", ""), ("bench/README.md", "bench/"), ("bench/HISTORY.md", "bench/")]
            .into_iter()
            .map(|(f, d)| (f.to_owned(), d.to_owned()))
            .chain(pages.iter().map(|p| (format!("docs/src/{p}"), "docs/src/".to_owned())))
            .chain([("docs/src/SUMMARY.md".to_owned(), "docs/src/".to_owned())])
    {
        for link in links(&read(&file)) {
            let path = format!("{root}/{dir}{link}");
            assert!(std::path::Path::new(&path).exists(), "{file} links to {link}, which does not exist");
        }
    }
    let readme = read("README.md");
    assert!(readme.lines().take(6).any(|l| l.starts_with("cargo run")) && readme.contains("cargo test"));
    let lines = readme.lines().count();
    assert!(lines <= 220, "the README is {lines} lines: the manual is docs/, not the README");
}
