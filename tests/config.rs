//! Config loading and the `check` / `serve` commands, run as a user would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use tidegate::config::{Config, ConfigError};

fn problems(text: &str) -> Vec<String> {
    match Config::parse(text, &|name| (name == "SET").then(|| "value".to_string())) {
        Ok(_) => vec![],
        Err(e) => e.problems(),
    }
}

const VALID: &str = "
upstreams:
  - { name: a, protocol: openai, base_url: https://api.example.com/v1, api_key: \"${SET}\" }
  - { name: b, protocol: anthropic, base_url: https://api.example.org }
models:
  m: { targets: [{ upstream: a, model: real }] }
  c: { targets: [{ upstream: b }] }
";

#[test]
fn valid_config_has_defaults_for_everything_else() {
    let c = Config::parse(VALID, &|name| (name == "SET").then(|| "value".to_string())).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8787");
    assert_eq!(c.max_body, 32 * 1024 * 1024);
    assert_eq!(c.upstreams[0].api_key.expose(), "value");
    assert_eq!(format!("{:?}", c.upstreams[0].api_key), "***");
    // No `model`: sent as the client asked, i.e. the alias itself.
    assert_eq!(c.models["c"].targets[0].model, None);
    assert_eq!(c.models["m"].targets[0].model.as_deref(), Some("real"));
}

#[test]
fn each_problem_is_reported_with_its_path() {
    let text = "
listen: 0.0.0.0:80
upstreams:
  - { name: a, protocol: openai, base_url: https://api.example.com/v1 }
  - { name: b, protocol: grpc, base_url: not a url, connect_timeout: soon }
  - { name: a, protocol: anthropic, base_url: http://x }
models:
  m: { targets: [{ upstream: nope }] }
  mixed: { targets: [{ upstream: a }, { upstream: b }] }
  empty: { targets: [] }
";
    let p = problems(text);
    let want = [
        "client_keys: none configured while listen 0.0.0.0:80",
        "upstreams[1].protocol: \"grpc\" is not one of openai, openai-chat, anthropic",
        "upstreams[1].base_url: \"not a url\" is not a URL",
        "upstreams[1].connect_timeout: \"soon\" is not a duration",
        "upstreams[2].name: \"a\" is used twice",
        "models.m.targets[0].upstream: unknown upstream \"nope\"",
        "models.empty.targets: at least one target is required",
    ];
    for w in want {
        assert!(p.iter().any(|line| line.starts_with(w)), "missing {w:?} in {p:#?}");
    }
}

#[test]
fn unknown_fields_and_type_errors_name_the_field() {
    let text = VALID.replace("api_key: \"${SET}\" }", "api_key: x, max_concurent: 3 }");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("upstreams[0].max_concurent: unknown field `max_concurent`"), "{p:?}");
    let p = problems(&format!("workers: many\n{VALID}"));
    assert!(p[0].starts_with("workers: invalid type"), "{p:?}");
}

#[test]
fn missing_environment_variable_is_named() {
    let p = problems(&VALID.replace("${SET}", "${OPENAI_KEY_FOR_TEST}"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("upstreams[0].api_key") && p[0].contains("OPENAI_KEY_FOR_TEST"), "{p:?}");
}

#[test]
fn targets_of_one_alias_may_speak_different_protocols() {
    let mixed =
        VALID.replace("targets: [{ upstream: b }]", "targets: [{ upstream: b }, { upstream: a, translate: false }]");
    assert_eq!(problems(&mixed), Vec::<String>::new());
    let config = Config::parse(&mixed, &|k| (k == "SET").then(|| "v".to_owned())).unwrap();
    let (_, route) = config.find_route("c").unwrap();
    assert_eq!(route.targets.iter().map(|t| t.translate).collect::<Vec<_>>(), [true, false]);
    let wrong = VALID.replace("targets: [{ upstream: b }]", "targets: [{ upstream: b, translate: maybe }]");
    assert!(problems(&wrong).iter().any(|l| l.contains("translate")), "{:?}", problems(&wrong));
}

#[test]
fn yaml_syntax_errors_are_reported() {
    let err = Config::parse("upstreams: [", &|_| None).err().unwrap();
    assert!(matches!(err, ConfigError::Yaml(_)));
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidegate"))
}

#[test]
fn check_command_exits_2_with_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, VALID.replace("https://api.example.org", "ftp:/x")).unwrap();
    let out = bin().args(["check", "--config"]).arg(&path).env("SET", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upstreams[1].base_url: \"ftp:/x\" is not a URL"), "{stderr}");

    std::fs::write(&path, VALID).unwrap();
    let out = bin().args(["check", "--config"]).arg(&path).env("SET", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn serve_writes_a_default_config_and_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidegate.yaml");
    let mut child = bin()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = String::new();
    let mut lines = BufReader::new(stderr).lines();
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("tidegate listening") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("wrote a commented default config"), "{seen}");
    assert!(seen.contains("tidegate listening"), "{seen}");
    let written = std::fs::read_to_string(&path).unwrap();
    assert!(written.contains("${OPENAI_API_KEY:-}") && written.contains("${ANTHROPIC_API_KEY:-}"));
    let out = bin().args(["check", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "default config must pass check");
}

#[test]
fn retry_rules_and_defaults_are_validated() {
    let text = VALID.replace(
        "api_key: \"${SET}\" }",
        "api_key: x, retry: [{ on_status: [400], on_body_contains: [TM.00001041], delay: later, max_attempts: 18 }, { on_body_contains: [\"\"] }], fatal: [{ on_body_contains: [TM.00001005], delay: 1s }] }",
    );
    let p = problems(&format!("defaults:\n  deadline: forever\n  retry: {{ max_delay: 1ms }}\n{text}"));
    let want = [
        "defaults.deadline: \"forever\" is not a duration",
        "defaults.retry.max_delay: must not be shorter than base_delay",
        "upstreams[0].retry[0].delay: \"later\" is not a duration",
        "upstreams[0].retry[1]: needs on_status or a non-empty on_body_contains",
        "upstreams[0].fatal[0]: a fatal rule forbids retrying",
    ];
    for w in want {
        assert!(p.iter().any(|line| line.starts_with(w)), "missing {w:?} in {p:#?}");
    }
}

#[test]
fn rules_and_deadlines_reach_the_typed_config() {
    let text = VALID
        .replace(
            "api_key: \"${SET}\" }",
            "api_key: x, retry: [{ on_status: [400, 429], on_body_contains: [TM.00001041], delay: 10s, max_attempts: 18 }] }",
        )
        .replace("c: { targets: [{ upstream: b }] }", "c: { targets: [{ upstream: b }], deadline: 30s }");
    let c = Config::parse(&format!("defaults: {{ deadline: 90s }}\n{text}"), &|_| None).unwrap();
    let rule = &c.upstreams[0].rules.retry[0];
    assert_eq!(rule.on_status, vec![400, 429]);
    assert_eq!(rule.delay, Some(Duration::from_secs(10)));
    assert_eq!(rule.max_attempts, Some(18));
    assert_eq!(c.models["m"].deadline, Duration::from_secs(90));
    assert_eq!(c.models["c"].deadline, Duration::from_secs(30));
    assert_eq!(c.retry.max_attempts, 6);
    assert!(c.stop_client_retries);
}

#[test]
fn cli_errors_are_one_line_with_the_fix() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("t.yaml");
    std::fs::write(&config, format!(
            "listen: {addr}\njournal: \"off\"\nupstreams: [{{ name: u, protocol: openai, base_url: \"http://127.0.0.1:9/v1\" }}]\nmodels: {{ m: {{ targets: [{{ upstream: u }}] }} }}\n"
        )).unwrap();
    let out = bin().args(["serve", "--config"]).arg(&config).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.starts_with("tidegate: ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains(&addr) && line.contains("--listen"), "{line}");
    assert_eq!(line.matches("in use").count(), 1, "said once: {line}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");

    let out = bin().args(["simulate", "--scenario", "nope"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("scenarios: healthy, capacity"), "{stderr}");

    let out = bin().args(["log", "--journal"]).arg(dir.path().join("none.db")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("send a request first"), "{stderr}");
}

#[test]
fn config_gaps_are_reported_with_their_field_paths() {
    let yaml = "max_body: 0\nadmin_key: same\nclient_keys: [{ name: a, key: same }]\nupstreams:\n  - { name: a, protocol: opneai, base_url: \"http://127.0.0.1:1/v1\" }\n  - { name: b, protocol: openai, base_url: \"http://user:pw@127.0.0.1:1/v1\" }\n  - { name: c, protocol: openai, base_url: \"http://127.0.0.1:1/v1?x=1\" }\n  - { name: d, protocol: openai, base_url: \"http://127.0.0.1:1/v1\", api_key: \"sk-1\\nX-Injected: 1\" }\n  - { name: e, protocol: openai, base_url: \"http://127.0.0.1:1/v1\" }\nmodels:\n  m:\n    targets: [{ upstream: a }, { upstream: e, weight: 0 }]\n";
    let problems = tidegate::config::Config::parse(yaml, &|_| None).unwrap_err().problems();
    let has = |p: &str| problems.iter().any(|x| x.starts_with(p));
    assert!(has("max_body: must be more than 0"), "{problems:#?}");
    assert!(has("admin_key: must differ"), "{problems:#?}");
    assert!(has("upstreams[0].protocol"), "{problems:#?}");
    assert!(has("upstreams[1].base_url: must not hold a user"), "{problems:#?}");
    assert!(has("upstreams[2].base_url: must not have a ?query"), "{problems:#?}");
    assert!(has("upstreams[3].api_key: holds characters"), "{problems:#?}");
    assert!(has("models.m.targets[1].weight: must be at least 1"), "{problems:#?}");
    // The invalid upstream `a` has its own problem; no "unknown upstream a (known: a)".
    assert!(!problems.iter().any(|p| p.contains("unknown upstream")), "{problems:#?}");
    // And no secret in any message.
    assert!(!problems.iter().any(|p| p.contains("sk-1") || p.contains("pw@")), "{problems:#?}");
}

#[test]
fn client_lanes_inherit_defaults_and_every_mistake_names_its_field() {
    let good = format!(
        "{VALID}client_defaults: {{ max_concurrent: 4, rpm: 100 }}\nbatch_share: 0.2\n\
         anomaly_action: {{ priority: batch, for: 5m }}\n\
         client_keys:\n  - {{ name: ide, key: k1, weight: 3 }}\n  - {{ name: ci, key: k2, priority: batch, max_concurrent: 1, models: {{ m: {{ rpm: 5 }} }} }}\n  - {{ name: ide, key: k3, weight: 3 }}\n"
    );
    let c = Config::parse(&good, &|name| (name == "SET").then(|| "value".to_string())).unwrap();
    let (ide, ci) = (&c.client_keys[0].lane, &c.client_keys[1].lane);
    assert_eq!((ide.limits.max_concurrent, ide.limits.rpm, ide.weight), (Some(4), Some(100), 3));
    assert_eq!((ci.limits.max_concurrent, ci.limits.rpm, ci.priority.as_str()), (Some(1), Some(100), "batch"));
    assert_eq!(ci.models[0].0.index(), 0, "per-alias limits by route index");
    assert_eq!(c.batch_share, 0.2);
    assert_eq!(c.anomaly_action.as_ref().unwrap().lasts, Duration::from_secs(300));

    let bad = format!(
        "{VALID}batch_share: 2\nanomaly_action: {{ for: soon }}\n\
         client_keys:\n  - {{ name: a, key: k1, weight: 0, priority: urgent, max_concurrent: 0 }}\n  - {{ name: b, key: k2, models: {{ nope: {{ rpm: 1 }}, m: {{ max_queue: 3 }} }} }}\n  - {{ name: a, key: k3, rpm: 9 }}\n"
    );
    let p = problems(&bad);
    let want = [
        "client_keys[0].max_concurrent: must be at least 1",
        "client_keys[0].weight: must be between 1 and 1000",
        "client_keys[0].priority: \"urgent\" is not a priority",
        "client_keys[1].models.nope: no model \"nope\" is configured",
        "client_keys[1].models.m: sets no limit",
        "client_keys[2]: has the name of client_keys[0] but other limits",
        "batch_share: must be between 0 and 1",
        "anomaly_action.for: \"soon\" is not a duration",
        "anomaly_action: set priority, max_concurrent or both",
    ];
    for w in want {
        assert!(p.iter().any(|x| x.starts_with(w)), "missing {w:?} in {p:#?}");
    }
    let clash = VALID.replace("name: a,", "name: \"client:a\",").replace("upstream: a,", "upstream: \"client:a\",");
    assert!(problems(&clash).iter().any(|x| x.contains("must not start with client:")));
}

/// `tidegate check` quotes names from the file (and from environment
/// variables it names): escaped, so a config cannot put control sequences
/// on the terminal of whoever checks it.
#[test]
fn check_escapes_what_it_quotes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("t.yaml");
    std::fs::write(
        &config,
        "journal: \"off\"\nupstreams: [{ name: u, protocol: openai, base_url: \"http://127.0.0.1:9/v1\" }]\nmodels: { m: { targets: [{ upstream: \"nope\\e[2J\\a\\r\\nforged: ok\" }] } }\n",
    )
    .unwrap();
    let out = bin().args(["check", "--config"]).arg(&config).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("unknown upstream"), "{stderr}");
    assert!(!stderr.chars().any(|c| c.is_control() && c != '\n'), "{stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn check_says_which_aliases_translate_and_which_clients_they_do_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(
        &path,
        "journal: \"off\"\nupstreams:\n  - { name: plan, protocol: anthropic, base_url: \"http://127.0.0.1:9\" }\n  - { name: deepseek, protocol: openai-chat, base_url: \"http://127.0.0.1:9/v1\" }\n  - { name: oai, protocol: openai, base_url: \"http://127.0.0.1:9/v1\" }\nmodels:\n  glm:\n    targets: [{ upstream: plan }, { upstream: deepseek }]\n  gpt:\n    targets: [{ upstream: oai, translate: false }]\n",
    )
    .unwrap();
    let out = bin().args(["check", "--config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("models.glm: openai-chat clients reach plan (anthropic) translated; openai-responses clients reach plan (anthropic), deepseek (openai-chat) translated; anthropic clients reach deepseek (openai-chat) translated"),
        "{text}"
    );
    assert!(text.contains("models.gpt: not served to anthropic clients; not served to gemini clients"), "{text}");
    assert!(
        text.contains("; gemini clients reach plan (anthropic), deepseek (openai-chat) translated"),
        "Gemini clients are reported too: {text}"
    );
}

#[test]
fn a_pool_becomes_one_upstream_per_account_and_its_targets_one_group() {
    let text = VALID.replace(
        "api_key: \"${SET}\" }",
        "api_key: shared, max_concurrent: 5, accounts: [{ name: x, api_key: kx }, { name: y, max_concurrent: 2, headers: { H: v } }] }",
    );
    let c = Config::parse(&text, &|_| None).unwrap();
    let names: Vec<&str> = c.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["a/x", "a/y", "b"]);
    assert_eq!(c.upstreams[0].api_key.expose(), "kx");
    assert_eq!(c.upstreams[1].api_key.expose(), "shared", "the upstream's key when the account has none");
    assert_eq!(c.upstreams[0].limits.max_concurrent, Some(5));
    assert_eq!(c.upstreams[1].limits.max_concurrent, Some(2));
    assert!(c.upstreams[1].headers.iter().any(|(n, _)| n == "h"));
    assert_eq!(c.upstreams[0].pool.as_ref().map(|p| p.account.as_str()), Some("x"));
    let (_, route) = c.find_route("m").unwrap();
    assert_eq!(route.targets.len(), 2);
    assert!(route.targets.iter().all(|t| t.group == Some(0) && t.model.as_deref() == Some("real")));
    // Names are checked, and so are the rules' classes.
    let bad = VALID.replace(
        "api_key: \"${SET}\" }",
        "retry: [{ on_status: [400], class: request }, { on_status: [402], class: entitlement, delay: 1s }], fatal: [{ on_status: [403], class: capacity }, { on_status: [401], class: nope }], accounts: [{ name: x }, { name: x }, { name: \"p/q\" }] }",
    );
    let p = problems(&bad);
    let want = [
        "upstreams[0].accounts[1].name: \"x\" is used twice",
        "upstreams[0].accounts[2].name: must be a non-empty name without /",
        "upstreams[0].retry[0].class: a request error is never retried",
        "upstreams[0].retry[1].class: entitlement moves the request",
        "upstreams[0].fatal[0].class: a fatal rule stops the request",
        "upstreams[0].fatal[1].class: \"nope\" is not one of",
    ];
    for w in want {
        assert!(p.iter().any(|line| line.starts_with(w)), "missing {w:?} in {p:#?}");
    }
}
