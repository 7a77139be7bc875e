//! `${VAR}` interpolation of secrets into config strings.
//!
//! Interpolation runs on the parsed YAML tree, not on the raw text, so a
//! missing variable is reported with the field path that needed it and a
//! `${...}` inside a YAML comment is never looked at.

use yaml_serde::Value;

/// Replaces `${VAR}` and `${VAR:-fallback}` in every string of `value`.
///
/// `$${` writes a literal `${`. A `${VAR}` whose variable is unset is an
/// error naming the variable; `${VAR:-}` means "empty when unset", which the
/// default config uses so a fresh install starts without any key.
pub fn interpolate(value: &mut Value, path: &str, lookup: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<String>) {
    match value {
        Value::String(s) => {
            if s.contains('$') {
                match expand(s, lookup) {
                    Ok(expanded) => *s = expanded,
                    Err(msg) => problems.push(format!("{}: {msg}", display_path(path))),
                }
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate(item, &format!("{path}[{i}]"), lookup, problems);
            }
        }
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let key = match key {
                    Value::String(k) => k.clone(),
                    other => format!("{other:?}"),
                };
                let child = if path.is_empty() { key } else { format!("{path}.{key}") };
                interpolate(item, &child, lookup, problems);
            }
        }
        Value::Tagged(tagged) => interpolate(&mut tagged.value, path, lookup, problems),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "(top level)" } else { path }
}

/// Expands one string; the error names the first unset variable.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, super::Problem> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail.find('}').ok_or_else(|| super::Problem(format!("unterminated `${{` in {input:?}")))?;
            let expr = &tail[..end];
            let (name, fallback) = match expr.split_once(":-") {
                Some((name, fallback)) => (name, Some(fallback)),
                None => (expr, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(super::Problem(format!("`${{{expr}}}` is not a valid variable name")));
            }
            match (lookup(name), fallback) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(fb)) => out.push_str(fb),
                (None, None) => {
                    return Err(super::Problem(format!(
                        "environment variable {name} is not set (write ${{{name}:-}} to allow it to be empty)"
                    )));
                }
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KEY" => Some("sk-123".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_variables_fallbacks_and_escapes() {
        let cases = [
            ("plain", Ok("plain".to_string())),
            ("${KEY}", Ok("sk-123".into())),
            ("Bearer ${KEY}!", Ok("Bearer sk-123!".into())),
            ("${MISSING:-}", Ok(String::new())),
            ("${MISSING:-dflt}", Ok("dflt".into())),
            ("${EMPTY:-dflt}", Ok(String::new())),
            ("$${KEY}", Ok("${KEY}".into())),
            ("cost $5", Ok("cost $5".into())),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &env).map_err(|e| e.0), want, "input {input:?}");
        }
    }

    #[test]
    fn missing_variable_is_named() {
        let err = expand("${NOPE}", &env).err().map(|e| e.0).unwrap_or_default();
        assert!(err.contains("NOPE"), "{err}");
        assert!(expand("${KEY", &env).is_err());
        assert!(expand("${bad-name}", &env).is_err());
    }

    #[test]
    fn reports_path_of_missing_variable() {
        let mut v: Value = yaml_serde::from_str("upstreams:\n  - api_key: \"${NOPE}\"\n").unwrap_or(Value::Null);
        let mut problems = Vec::new();
        interpolate(&mut v, "", &env, &mut problems);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("upstreams[0].api_key: environment variable NOPE"), "{problems:?}");
    }
}
