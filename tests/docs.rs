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
