//! The README's config reference covers every config field: a field added
//! to `src/config/raw.rs` without documentation fails here.

#[test]
fn every_config_field_is_in_the_readme() {
    let raw = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/config/raw.rs")).unwrap_or_default();
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
