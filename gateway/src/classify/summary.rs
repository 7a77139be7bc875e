//! One human line of what a provider said, from whatever shape it used.

use serde_json::Value;

const MAX: usize = 240;

/// The provider's message and code from a JSON error body (OpenAI,
/// Anthropic, and common gateway shapes), an HTML page's title, or the
/// first line of plain text; truncated to one readable line.
pub fn summarize(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return "(empty body)".into();
    }
    if let Ok(v) = serde_json::from_str::<Value>(trimmed)
        && let Some(line) = from_json(&v)
    {
        return clip(&line);
    }
    if let Some(title) = html_title(trimmed) {
        return clip(&title);
    }
    clip(trimmed.lines().next().unwrap_or(trimmed))
}

fn from_json(v: &Value) -> Option<String> {
    let err = match v.get("error") {
        Some(Value::String(s)) => return Some(s.clone()),
        Some(e @ Value::Object(_)) => e,
        _ => v,
    };
    let err = match err.get("data") {
        Some(d @ Value::Object(_)) if err.get("message").is_none() => d,
        _ => err,
    };
    let message = ["message", "msg", "error_msg", "detail", "error_description"]
        .iter()
        .find_map(|k| err.get(*k).and_then(Value::as_str).or_else(|| v.get(*k).and_then(Value::as_str)))?;
    let code = ["code", "error_code", "providerCode", "type"].iter().find_map(|k| match err.get(*k) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    });
    Some(match code {
        Some(code) if !message.contains(&code) => format!("{message} ({code})"),
        _ => message.to_string(),
    })
}

fn html_title(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let start = lower.find("<title>")? + "<title>".len();
    let end = lower[start..].find("</title>")? + start;
    let title = text[start..end].trim();
    (!title.is_empty()).then(|| title.to_string())
}

fn clip(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX {
        return one_line;
    }
    let mut out: String = one_line.chars().take(MAX).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let cases = [
            (
                r#"{"error":{"message":"model concurrency limit exceeded","code":"3009"}}"#,
                "model concurrency limit exceeded (3009)",
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                "Overloaded (overloaded_error)",
            ),
            (
                r#"{"error_code":"TM.00001041","error_msg":"并发会话数已达上限(3个)"}"#,
                "并发会话数已达上限(3个) (TM.00001041)",
            ),
            (r#"{"error":{"data":{"code":14018,"msg":"额度已用尽"}}}"#, "额度已用尽 (14018)"),
            (r#"{"detail":"boom"}"#, "boom"),
            (r#"{"error":"plain string"}"#, "plain string"),
            (
                "<html><head><title>503 Service Temporarily Unavailable</title></head></html>",
                "503 Service Temporarily Unavailable",
            ),
            ("upstream connect error\nmore", "upstream connect error"),
            ("", "(empty body)"),
        ];
        for (body, want) in cases {
            assert_eq!(summarize(body.as_bytes()), want, "{body}");
        }
        assert!(summarize("x".repeat(1000).as_bytes()).chars().count() <= MAX + 1);
    }
}
