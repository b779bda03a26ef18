//! A headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`, through `fantoccini`), and the waits the browser
//! tests use: a condition read from the page, asked again until it holds
//! or a generous deadline passes (never a fixed sleep).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};

use crate::helpers::free_port;

/// How long a condition on the page may take: long, for a busy two-core
/// machine; a passing test waits only as long as the page needs.
pub const DEADLINE: Duration = Duration::from_secs(60);
const PAUSE: Duration = Duration::from_millis(100);

/// A browser of the test's own, and the chromedriver that runs it (in a
/// process group of its own, ended with it).
pub struct Browser {
    /// `None` once closed: a session ends only when its last handle goes.
    client: Option<Client>,
    driver: Child,
    profile: PathBuf,
    /// This test's turn with a browser, held until it is dropped.
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

fn chromedriver() -> &'static str {
    ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .expect("chromedriver is installed (scripts/deps.sh installs chromium-driver)")
}

fn chromium() -> &'static str {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .expect("chromium is installed (scripts/deps.sh installs it)")
}

/// One browser at a time in this process: a few at once on two cores
/// starve each other (and a Chromium that starts beside another may never
/// answer its driver).
static ONE_AT_A_TIME: LazyLock<Arc<tokio::sync::Mutex<()>>> = LazyLock::new(Default::default);

/// How long a session may take to start before the driver is started
/// again.
const SESSION_START: Duration = Duration::from_secs(45);

impl Browser {
    /// A fresh headless Chromium, `width` pixels wide, with none of its
    /// own traffic.
    pub async fn start(width: u32) -> Self {
        let turn = ONE_AT_A_TIME.clone().lock_owned().await;
        for _ in 0..3 {
            if let Some(mut browser) = Self::try_start(width).await {
                browser.turn = Some(turn);
                return browser;
            }
        }
        panic!("no WebDriver session in three tries");
    }

    /// One try: the driver, then a session on it within [`SESSION_START`].
    async fn try_start(width: u32) -> Option<Self> {
        let port = free_port();
        let profile = std::env::temp_dir().join(format!(
            "seckill-webdriver-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&profile).expect("a profile directory");
        // Its log in the profile's directory, for a failed run.
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                profile.join("chromedriver.log").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut browser = Self {
            client: None,
            driver,
            profile,
            turn: None,
        };
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium(),
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-crash-reporter",
                    "--disable-breakpad",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    format!("--window-size={width},1000"),
                    format!("--user-data-dir={}", browser.profile.join("chromium").display()),
                ],
            }),
        );
        let started = Instant::now();
        // The driver listens first: a session is asked for once.
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < DEADLINE, "chromedriver does not listen");
            tokio::time::sleep(PAUSE).await;
        }
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        let url = format!("http://127.0.0.1:{port}");
        let session = builder.connect(&url);
        match tokio::time::timeout(SESSION_START, session).await {
            Ok(Ok(client)) => {
                browser.client = Some(client);
                Some(browser)
            }
            // Dropped: the driver's group ends, and the next try begins.
            _ => None,
        }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("the session is open")
    }

    /// Ends the session (the browser with it): `Quit`, whose answer comes
    /// at once; fantoccini's wait for its session task after it may not
    /// end, so it is bounded, and the driver's group is ended on drop.
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client().goto(url).await.expect("the page loads");
    }

    /// Runs `script` in the page: what it returns.
    pub async fn run(&self, script: &str) -> Value {
        self.client()
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", opening(script)))
    }

    /// Runs `script` in the page asynchronously: what it hands to its last
    /// argument, the callback.
    pub async fn run_async(&self, script: &str) -> Value {
        self.client()
            .execute_async(script, Vec::new())
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", opening(script)))
    }

    /// The text of the element `testid` names (`None` while there is none
    /// or it is hidden).
    pub async fn text(&self, testid: &str) -> Option<String> {
        let script = format!(
            "const e = document.querySelector('[data-testid=\"{testid}\"]'); \
             return e && e.offsetParent !== null ? e.textContent.trim() : null;"
        );
        self.run(&script).await.as_str().map(str::to_owned)
    }

    /// An attribute of the element `testid` names.
    pub async fn attribute(&self, testid: &str, name: &str) -> Option<String> {
        let script = format!(
            "const e = document.querySelector('[data-testid=\"{testid}\"]'); \
             return e ? e.getAttribute('{name}') : null;"
        );
        self.run(&script).await.as_str().map(str::to_owned)
    }

    /// Whether the button `testid` names shows and can be pressed.
    pub async fn enabled(&self, testid: &str) -> bool {
        let script = format!(
            "const e = document.querySelector('[data-testid=\"{testid}\"]'); \
             return Boolean(e && e.offsetParent !== null && !e.disabled);"
        );
        self.run(&script).await == Value::Bool(true)
    }

    /// Clicks the element `testid` names, as a user does (WebDriver's
    /// click: it must be visible and enabled).
    pub async fn click(&self, testid: &str) {
        self.client()
            .find(Locator::Css(&format!("[data-testid=\"{testid}\"]")))
            .await
            .unwrap_or_else(|error| panic!("no {testid}: {error}"))
            .click()
            .await
            .unwrap_or_else(|error| panic!("cannot click {testid}: {error}"));
    }

    /// Types `text` into the input `testid` names.
    pub async fn type_into(&self, testid: &str, text: &str) {
        let input = self
            .client()
            .find(Locator::Css(&format!("[data-testid=\"{testid}\"]")))
            .await
            .unwrap_or_else(|error| panic!("no {testid}: {error}"));
        input.clear().await.expect("the input clears");
        input.send_keys(text).await.expect("the input takes keys");
    }

    /// Reads the page with `read` until `done` holds of what it read, for
    /// [`DEADLINE`] at most; the last reading.
    pub async fn wait_for<T, F>(
        &self,
        what: &str,
        mut read: impl FnMut() -> F,
        done: impl Fn(&T) -> bool,
    ) -> T
    where
        T: std::fmt::Debug,
        F: std::future::Future<Output = T>,
    {
        crate::helpers::poll_until(DEADLINE, PAUSE, what, &mut read, done).await
    }

    /// Waits until the element `testid` names reads `text`.
    pub async fn wait_text(&self, testid: &str, text: &str) {
        self.wait_for(
            &format!("{testid} reads {text:?}"),
            || self.text(testid),
            |seen| seen.as_deref() == Some(text),
        )
        .await;
    }

    /// Waits until the message line names the error `code`.
    pub async fn wait_error(&self, code: &str) {
        self.wait_for(
            &format!("the message {code}"),
            || self.attribute("message", "data-error"),
            |error| error.as_deref() == Some(code),
        )
        .await;
    }

    /// Waits until the element `testid` names can be clicked.
    pub async fn wait_enabled(&self, testid: &str) {
        self.wait_for(
            &format!("{testid} open"),
            || self.enabled(testid),
            |open| *open,
        )
        .await;
    }

    /// A screenshot of the page, written to `name` under
    /// `SECKILL_SCREENSHOTS` when that is set (the guide's pictures are
    /// refreshed so: `scripts/screenshots.sh`).
    pub async fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("SECKILL_SCREENSHOTS") else {
            return;
        };
        let png = self.client().screenshot().await.expect("a screenshot");
        let path = PathBuf::from(dir).join(name);
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// A script's first 200 characters, to name it in a failure (axe-core's
/// is half a megabyte).
fn opening(script: &str) -> &str {
    let end = script
        .char_indices()
        .nth(200)
        .map_or(script.len(), |(at, _)| at);
    &script[..end]
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver's whole group: the browser it started goes too.
        // `--` first: procps's kill reads a bare `-<pid>` as an option.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--"])
            .arg(format!("-{}", self.driver.id()))
            .status();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
