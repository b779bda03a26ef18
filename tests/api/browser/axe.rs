//! axe-core (npm, installed by `scripts/deps.sh` under
//! `target/test-tools/`) run in the page the browser shows: read from
//! disk, injected through WebDriver's `execute` (nothing from another
//! host), and `axe.run()` through `execute_async`. A serious or critical
//! violation fails the test, each named with its rule, impact, help and
//! the elements it found.

use std::path::PathBuf;

use serde_json::Value;

use super::driver::Browser;

/// Where `scripts/deps.sh` installs axe-core.
fn axe_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-tools/npm/node_modules/axe-core/axe.min.js")
}

/// axe-core's script: a missing file fails the test (it is a test tool
/// like Chromium, not an option).
fn axe_script() -> String {
    let path = axe_path();
    std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error}; axe-core is installed by `SECKILL_TEST_TOOLS=1 source scripts/deps.sh`",
            path.display()
        )
    })
}

/// Runs axe over the whole page; its violations, each as
/// `{id, impact, help, targets}`.
const RUN: &str = "const done = arguments[arguments.length - 1]; \
    axe.run(document, { resultTypes: ['violations'] }).then( \
      (result) => done({ violations: result.violations.map((v) => ({ \
        id: v.id, impact: v.impact, help: v.help, \
        targets: v.nodes.map((n) => n.target.join(' ')) })) }), \
      (error) => done({ error: String(error) }));";

impl Browser {
    /// Asserts that axe-core finds no serious or critical violation in the
    /// page as it shows now (`what` names the moment, for the failure).
    pub async fn assert_accessible(&self, what: &str) {
        if self.run("return typeof window.axe").await != "object" {
            self.run(&axe_script()).await;
        }
        let loaded = self.run("return typeof window.axe").await;
        assert_eq!(loaded, "object", "axe-core did not load in {what}");
        let result = self.run_async(RUN).await;
        assert!(result["error"].is_null(), "axe.run in {what}: {result}");
        let violations = result["violations"]
            .as_array()
            .expect("a list of violations");
        let serious: Vec<String> = violations
            .iter()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .map(describe)
            .collect();
        assert!(
            serious.is_empty(),
            "axe-core finds in {what}:\n{}",
            serious.join("\n")
        );
    }
}

fn describe(violation: &Value) -> String {
    let targets: Vec<&str> = violation["targets"]
        .as_array()
        .map(|nodes| nodes.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "- {} ({}): {}; at {}",
        violation["id"].as_str().unwrap_or("?"),
        violation["impact"].as_str().unwrap_or("?"),
        violation["help"].as_str().unwrap_or("?"),
        targets.join(", ")
    )
}
