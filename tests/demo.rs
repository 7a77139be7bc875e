//! `tidegate demo` asserts its own claims: straight at the faulty
//! simulator some requests fail, through tidegate all succeed.

use std::process::Command;

use tidegate_simulate::demo::{Options, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_burst_fails_direct_and_succeeds_through_tidegate() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { requests: 16, progress: false, journal: dir.path().join("demo.db") };
    let report = run(&options).await.unwrap();
    let table = report.table();
    assert_eq!(report.gateway.succeeded, 16, "through tidegate every request succeeds:\n{table}");
    assert_eq!(report.gateway.failed(), 0, "{table}");
    assert!(report.direct.failed() > 0, "straight at the simulator some fail:\n{table}");
    assert!(
        report.direct.failures.keys().any(|k| k.contains("429")),
        "the cap shows as 429s when nothing absorbs it:\n{table}"
    );
    assert_eq!(report.behind.rows, 16, "one journal row per request");
    assert!(report.behind.retries > 0, "tidegate absorbed refusals:\n{table}");
    assert!(table.contains("16/16"), "{table}");
}

#[test]
fn demo_command_exits_zero_and_prints_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["demo", "--requests", "12", "--journal"])
        .arg(dir.path().join("demo.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("through tidegate") && stdout.contains("12/12"), "{stdout}");
    assert!(stdout.contains("tidegate log --journal"), "{stdout}");
}
