//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver) against the service in this process (port 0); plus the page's HTTP contract.
//!
//! Needs Debian's `chromium`, `chromium-driver` and `zbar-tools` (the QR code
//! on the page is decoded by `zbarimg`); `.ci/run` installs them. The tests
//! take screenshots of each main screen; `POTLUCK_UPDATE_SCREENSHOTS=1`
//! writes them to `docs/screenshots/`.

use crate::support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use support::rig::Rig;
use support::{wait_for, Api, Db, Env, ADMIN};
use tokio::process::{Child, Command};

/// Every `detail.code` the service answers (crates/rounds error types).
const SERVICE_CODES: &[&str] = &[
    "not_authenticated",
    "invalid_token",
    "session_expired",
    "invalid_credentials",
    "current_password_incorrect",
    "username_taken",
    "derivation_index_conflict",
    "too_many_attempts",
    "registration_quota_exceeded",
    "stream_capacity",
    "not_found",
    "internal_error",
    "invalid_body",
    "invalid_query",
    "password_too_short",
    "password_too_long",
    "username_too_short",
    "username_too_long",
    "username_invalid_characters",
    "paused",
    "insufficient_funds",
    "amount_below_dust",
    "broadcast_rejected",
    "funds_busy",
    "bet_below_minimum",
    "round_not_open",
    "invalid_address",
    "address_wrong_network",
    "withdrawal_below_minimum",
    "no_round_played",
    "faucet_amount_invalid",
];

/// Generous: the machine may be busy with other builds.
const WAIT: Duration = Duration::from_secs(60);

/// A chromedriver process; each [`Browser`] is its own session (own profile,
/// own storage), so two of them are two independent browser contexts.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Driver {
        use tokio::io::AsyncBufReadExt as _;
        let marker = "started successfully on port ";
        // Port 0: chromedriver binds a free port itself and reports it
        // ("ChromeDriver was started successfully on port N."). Its output
        // goes to the test's log; one start exited at once without reporting
        // (not reproduced), so an exit before the report is retried twice.
        let mut attempts = 0;
        let (child, port) = loop {
            attempts += 1;
            let mut child = Command::new("chromedriver")
                .arg("--port=0")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("chromedriver (Debian package chromium-driver) is installed");
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let port = tokio::time::timeout(WAIT, async {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("chromedriver: {line}");
                    if let Some(rest) = line.split(marker).nth(1) {
                        return rest.trim().trim_end_matches('.').parse::<u16>().ok();
                    }
                }
                None
            })
            .await
            .expect("chromedriver reports its port within the deadline");
            if let Some(port) = port {
                // Its later output is drained: a write into a closed pipe would kill it.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                break (child, port);
            }
            let status = child.wait().await.unwrap();
            assert!(
                attempts < 3,
                "chromedriver exited ({status}) before reporting its port, {attempts} times"
            );
            eprintln!(
                "chromedriver exited ({status}) before reporting its port; starting it again"
            );
        };
        let url = format!("http://127.0.0.1:{port}");
        wait_for("chromedriver to accept connections", WAIT, || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Driver { child, url }
    }

    async fn browser(&self, server: &Api) -> Browser {
        let mut caps = serde_json::Map::new();
        let mut options = json!({
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,1100",
                "--lang=en-US",
            ]
        });
        if std::path::Path::new("/usr/bin/chromium").exists() {
            options["binary"] = json!("/usr/bin/chromium");
        }
        caps.insert("goog:chromeOptions".into(), options);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session");
        Browser {
            client,
            base: format!("http://{}", server.addr),
        }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// One browser session on the dashboard.
struct Browser {
    client: Client,
    base: String,
}

impl Browser {
    async fn open(&self, fragment: &str) {
        self.client
            .goto(&format!("{}/{fragment}", self.base))
            .await
            .unwrap();
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Polls `script` (a JS expression) until it is truthy; returns its value.
    async fn wait_js(&self, what: &str, script: &str) -> Value {
        wait_for(what, WAIT, || async {
            let v = self.js(&format!("return ({script});")).await;
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            truthy.then_some(v)
        })
        .await
    }

    /// Waits until `#id` is visible and its text contains `needle`; returns the text.
    async fn wait_text(&self, id: &str, needle: &str) -> String {
        wait_for(&format!("#{id} showing {needle:?}"), WAIT, || async {
            let text = self.text(id).await;
            if text.contains(needle) && self.visible(id).await {
                Ok(text)
            } else {
                Err(format!("{text:?}"))
            }
        })
        .await
    }

    async fn text(&self, id: &str) -> String {
        self.js(&format!(
            "const e = document.getElementById('{id}'); return e ? e.textContent : null;"
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    async fn visible(&self, id: &str) -> bool {
        self.js(&format!(
            "const e = document.getElementById('{id}'); return !!e && e.offsetParent !== null;"
        ))
        .await
            == json!(true)
    }

    async fn fill(&self, id: &str, value: &str) {
        let e = self.client.find(Locator::Id(id)).await.unwrap();
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    /// Clicks the element matching `css`. The page re-renders lists on every
    /// stream notification, so an element found a moment ago may have been
    /// replaced: the lookup is repeated then, as a user would click again.
    /// Fills the fields `values` (id, value) and submits the form `form`.
    async fn submit(&self, form: &str, values: &[(&str, &str)]) {
        for (id, value) in values {
            self.fill(id, value).await;
        }
        self.click(&format!("{form} button[type=submit]")).await;
    }

    async fn click(&self, css: &str) {
        for attempt in 0.. {
            let clicked = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.click().await,
                Err(e) => Err(e),
            };
            match clicked {
                Ok(()) => return,
                Err(e) if attempt < 5 && e.is_stale_element_reference() => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("clicking {css}: {e:?}"),
            }
        }
    }

    /// Saves a screenshot of the whole window as `{name}.png` (see [`screenshots_dir`]).
    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = screenshots_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Ends the session; the page must not have logged a script error or a
    /// CSP violation.
    async fn close(self) {
        let errors = self
            .js("return window.Potluck ? Potluck.errors : ['the page did not start'];")
            .await;
        let _ = self.client.close().await;
        assert_eq!(errors, json!([]), "errors in the page");
    }
}

/// `docs/screenshots/` with `POTLUCK_UPDATE_SCREENSHOTS=1`; otherwise the
/// target directory, so that an ordinary test run leaves the tree clean.
fn screenshots_dir() -> PathBuf {
    if std::env::var_os("POTLUCK_UPDATE_SCREENSHOTS").is_some_and(|v| !v.is_empty()) {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots")
    }
}

/// Decodes the QR code in `png` with zbarimg (Debian `zbar-tools`).
fn decode_qr(png: &[u8]) -> String {
    let path = std::env::temp_dir().join(format!("potluck-qr-{:08x}.png", rand::random::<u32>()));
    std::fs::write(&path, png).unwrap();
    let out = std::process::Command::new("zbarimg")
        .args(["--raw", "-q"])
        .arg(&path)
        .output()
        .expect("zbarimg (Debian package zbar-tools) is installed");
    let _ = std::fs::remove_file(&path);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every error code in the service's source has an English and a German
/// text in the page's table, so no code ever reaches a user untranslated.
#[test]
fn every_error_code_of_the_service_is_translated() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rounds");
    // The service defines its codes in one place.
    let codes: std::collections::BTreeSet<String> = potluck_rounds::http::codes::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert!(codes.len() >= 25, "found only {codes:?}");
    for code in SERVICE_CODES {
        assert!(
            codes.contains(*code),
            "{code} is no longer answered by the service"
        );
    }
    let i18n = std::fs::read_to_string(root.join("assets/i18n.js")).unwrap();
    let (en, de) = i18n.split_at(i18n.find("const de = {").unwrap());
    for code in &codes {
        let key = format!("err_{code}:");
        assert!(en.contains(&key), "no English text for {code}");
        assert!(de.contains(&key), "no German text for {code}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_and_assets_are_served_with_their_headers() {
    let env = Env::new(Db::Sqlite).await;
    let s = support::spawn_app(&env).await;
    let page = s.get("/", &[]).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let html = page.text();
    let mut total = page.body.len();
    let mut names = Vec::new();
    for part in html.split("\"/assets/").skip(1) {
        let name = &part[..part.find('"').unwrap()];
        let r = s.get(&format!("/assets/{name}"), &[]).await;
        assert_eq!(r.status, 200, "{name}");
        let expected = match name.rsplit('.').next().unwrap() {
            "js" => "text/javascript; charset=utf-8",
            "css" => "text/css; charset=utf-8",
            "svg" => "image/svg+xml",
            other => panic!("unexpected asset type {other}"),
        };
        assert_eq!(r.header("content-type"), Some(expected), "{name}");
        total += r.body.len();
        names.push(name.to_string());
    }
    assert!(names.len() >= 5, "{names:?}");
    // The first load, every asset once: the budget is 200 KB.
    assert!(total < 200 * 1024, "first load {total} bytes");
    println!("first load: {total} bytes in {} files", names.len() + 1);

    // Revalidation: the same ETag answers 304 without a body.
    let r = s.get("/assets/app.js", &[]).await;
    let tag = r.header("etag").unwrap().to_string();
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let again = s.get("/assets/app.js", &[("if-none-match", &tag)]).await;
    assert_eq!(again.status, 304);
    assert!(again.body.is_empty());

    // Fragment routing: no other path is the page.
    for path in [
        "/assets/nope.js",
        "/assets/",
        "/index.html",
        "/play",
        "/admin",
    ] {
        let r = s.get(path, &[]).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.code(), "not_found", "{path}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_errors_and_translations_in_the_browser() {
    let env = Env::new(Db::Sqlite).await;
    let s = support::spawn_app(&env).await;
    let driver = Driver::start().await;
    let b = driver.browser(&s).await;
    b.open("").await;
    b.wait_text("login-form", "Log in").await;
    // The public round is shown logged out, with a running countdown.
    b.wait_js(
        "round id",
        "document.getElementById('round-id').textContent.startsWith('#')",
    )
    .await;
    b.wait_text("live-status", "live").await;
    b.screenshot("login").await;

    dropped_stream_polls_then_reconnects(&s, &b).await;

    errors_in_both_languages(&b).await;

    let (address, token) = register_in_the_page(&s, &b).await;

    taken_name_and_wrong_password(&b).await;

    password_change_and_reset_end_sessions(&s, &b, &address, &token).await;

    b.close().await;
    driver.stop().await;
    s.stop().await;
}

/// A dropped stream: five newer streams from the same IP evict the page's; it polls, then reconnects after its back-off.
async fn dropped_stream_polls_then_reconnects(s: &Api, b: &Browser) {
    let mut evictors = Vec::new();
    for _ in 0..5 {
        evictors.push(support::EventStream::open(s.addr, "127.0.0.1").await);
    }
    b.wait_js(
        "polling, then live again",
        "(() => { const h = Potluck.state.liveHistory; const i = h.lastIndexOf('polling'); return i > 0 && h.indexOf('live') < i && h[h.length - 1] === 'live'; })()",
    )
    .await;
    drop(evictors);
}

/// Validation errors come through the client's own table, in English and German, and every code the service answers has a text.
async fn errors_in_both_languages(b: &Browser) {
    b.submit(
        "#register-form",
        &[
            ("register-username", "al"),
            ("register-password", "password123"),
        ],
    )
    .await;
    b.wait_text(
        "register-error",
        "The username must have at least 3 characters.",
    )
    .await;
    b.submit(
        "#register-form",
        &[
            ("register-username", "alice"),
            ("register-password", "short"),
        ],
    )
    .await;
    b.wait_text(
        "register-error",
        "The password must have at least 8 characters.",
    )
    .await;

    // The same code in German, with the page's texts.
    b.client
        .find(Locator::Id("lang"))
        .await
        .unwrap()
        .select_by_value("de")
        .await
        .unwrap();
    b.wait_text("login-form", "Anmelden").await;
    b.click("#register-form button[type=submit]").await;
    b.wait_text(
        "register-error",
        "Das Passwort braucht mindestens 8 Zeichen.",
    )
    .await;
    // A code the table does not know falls back to the server's message.
    let fallback = b
        .js("return Potluck.errorText({code: 'brand_new_code', message: 'the server says so', params: {}});")
        .await;
    assert_eq!(fallback, json!("the server says so"));
    // Amounts in sats and BTC from the `_sats` params, in the page's language.
    assert_eq!(
        b.js("return Potluck.t('err_bet_below_minimum', {min_bet_sats: 123456789});")
            .await,
        json!("Der kleinste Einsatz ist 123.456.789 sats (1,23456789 BTC).")
    );
    // Both languages cover every text and every code the service answers.
    let missing = b
        .js("const {en, de} = PotluckI18n.tables; return Object.keys(en).filter(k => !(k in de)).concat(Object.keys(de).filter(k => !(k in en)));")
        .await;
    assert_eq!(missing, json!([]));
    for code in SERVICE_CODES {
        assert_eq!(
            b.js(&format!("return 'err_{code}' in PotluckI18n.tables.en;"))
                .await,
            json!(true),
            "no translation for {code}"
        );
    }
    b.client
        .find(Locator::Id("lang"))
        .await
        .unwrap()
        .select_by_value("en")
        .await
        .unwrap();
    assert_eq!(
        b.js("return Potluck.fmtSats(1000);").await,
        json!("1,000 sats (0.00001000 BTC)")
    );
}

/// Registering logs in at once and shows the address with its QR code; the address and the API's token.
async fn register_in_the_page(s: &Api, b: &Browser) -> (String, String) {
    // Register: logged in at once, the address with its QR code.
    b.submit(
        "#register-form",
        &[
            ("register-username", "Alice"),
            ("register-password", "password123"),
        ],
    )
    .await;
    let address = b.wait_text("address", "bcrt1q").await;
    let me = s.login("Alice", "password123", "10.0.0.1").await;
    let token = me.json()["access_token"].as_str().unwrap().to_string();
    let api_me = s
        .get(
            "/users/me",
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await
        .json();
    assert_eq!(address, api_me["address"].as_str().unwrap());
    b.wait_text("whoami", "Alice").await;
    b.wait_text("balance", "0 sats (0.00000000 BTC)").await;
    let qr = b
        .client
        .find(Locator::Id("qr"))
        .await
        .unwrap()
        .screenshot()
        .await
        .unwrap();
    assert_eq!(
        decode_qr(&qr),
        address,
        "the QR code decodes to the address"
    );
    b.screenshot("wallet").await;
    (address, token)
}

/// A taken name (ignoring case) and a wrong password are refused in the page; the right one logs in.
async fn taken_name_and_wrong_password(b: &Browser) {
    // Taken name (ignoring case) in a second tab of the same session is
    // not needed: log out, try to register it again.
    b.click("#logout-btn").await;
    b.wait_text("notice", "You are logged out.").await;
    b.submit(
        "#register-form",
        &[
            ("register-username", "ALICE"),
            ("register-password", "password123"),
        ],
    )
    .await;
    b.wait_text("register-error", "The username ALICE is already taken.")
        .await;

    // Wrong password, then the right one.
    b.submit(
        "#login-form",
        &[
            ("login-username", "alice"),
            ("login-password", "wrong-password"),
        ],
    )
    .await;
    b.wait_text("login-error", "Wrong username or password.")
        .await;
    b.submit("#login-form", &[("login-password", "password123")])
        .await;
    b.wait_text("whoami", "Alice").await;
}

/// A password change ends older sessions; the token survives a reload until the operator resets the password.
async fn password_change_and_reset_end_sessions(s: &Api, b: &Browser, address: &str, token: &str) {
    // Change the password: a wrong current one is refused, then the page
    // carries on with the fresh token.
    b.submit(
        "#password-form",
        &[
            ("current-password", "not-my-password"),
            ("new-password", "password456"),
        ],
    )
    .await;
    b.wait_text("password-error", "The current password is incorrect.")
        .await;
    b.submit("#password-form", &[("current-password", "password123")])
        .await;
    b.wait_text("notice", "Password changed.").await;
    let r = s
        .get(
            "/users/me",
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
    assert_eq!(r.code(), "session_expired", "older sessions end");

    // The token survives a reload (kept for the browser session)...
    b.client.refresh().await.unwrap();
    b.wait_text("address", address).await;
    b.wait_text("whoami", "Alice").await;
    // ...until the operator resets the password: the next fetch is
    // answered session_expired and the page says so.
    let r = s
        .admin_post(
            "/admin/users/alice/reset-password",
            json!({"new_password": "new-password-1"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    b.client.refresh().await.unwrap();
    b.wait_text("notice", "Your session has expired; please log in again.")
        .await;
    b.wait_text("login-form", "Log in").await;
    assert!(!b.visible("account-card").await);
    // The reason stays until the next notice: it used to hide after 8 s, read by no one
    // who looked away (and by this test once, on a loaded machine).
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        b.visible("notice").await,
        "the session's end is no longer explained"
    );
    assert_eq!(
        b.js("return sessionStorage.getItem('potluck.token');")
            .await,
        Value::Null,
        "the dead token is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_journey_in_the_browser_with_polling_fallback() {
    let env = Env::new(Db::Sqlite).await;
    // No stream slots at all: every stream attempt gets 503, so the page
    // must fall back to polling.
    let s = support::spawn_app_with(&env, |c| c.stream.max_subscribers = 0).await;
    let driver = Driver::start().await;
    let b = driver.browser(&s).await;
    b.open("#/admin").await;
    b.wait_text("live-status", "polling").await;

    // Wrong token: the service's bare-string denial, nothing unlocked.
    b.submit("#admin-login", &[("admin-token", "not-the-token")])
        .await;
    let denial = s
        .get("/admin/config", &[("x-admin-token", "not-the-token")])
        .await
        .json()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    b.wait_text("admin-login-error", &denial).await;
    assert!(!b.visible("admin-panel").await);

    b.submit("#admin-login", &[("admin-token", ADMIN)]).await;
    b.wait_js(
        "config form",
        "document.getElementById('cfg-fee_rate_sat_vb')",
    )
    .await;
    let stored = b
        .js("return JSON.stringify({...localStorage}) + JSON.stringify({...sessionStorage}) + document.cookie + JSON.stringify(Potluck.state);")
        .await;
    assert!(
        !stored.as_str().unwrap().contains(ADMIN),
        "the admin token is stored nowhere: {stored}"
    );
    config_errors_inline_then_saved_and_audited(&s, &b).await;

    pause_and_resume_audited(&s, &b).await;

    // A change made elsewhere reaches the page by polling (no stream slot).
    let r = s.admin_post("/admin/pause", json!({})).await;
    assert_eq!(r.status, 200);
    b.wait_text("paused-banner", "paused for maintenance").await;
    assert_eq!(b.text("live-status").await, "polling");

    // The token is forgotten on reload.
    b.client.refresh().await.unwrap();
    b.wait_js(
        "the token form",
        "document.getElementById('admin-login').offsetParent !== null",
    )
    .await;
    assert!(!b.visible("admin-panel").await);

    b.close().await;
    driver.stop().await;
    s.stop().await;
}

/// One invalid value among valid ones: the field's error inline, nothing saved; fixed, it is saved and the audit log shows the diff.
async fn config_errors_inline_then_saved_and_audited(s: &Api, b: &Browser) {
    let before = s.admin_get("/admin/config").await.json();

    // One invalid value among valid ones: the field's error inline, nothing saved.
    b.submit(
        "#config-form",
        &[
            ("cfg-fee_rate_sat_vb", "0"),
            ("cfg-round_duration_seconds", "90"),
        ],
    )
    .await;
    b.wait_text(
        "cfg-error-fee_rate_sat_vb",
        "fee_rate_sat_vb must be at least 1",
    )
    .await;
    b.screenshot("admin-config-error").await;
    assert_eq!(s.admin_get("/admin/config").await.json(), before);

    // Fixed: saved, and the audit log shows the diff.
    b.submit("#config-form", &[("cfg-fee_rate_sat_vb", "7")])
        .await;
    b.wait_text("config-saved", "Saved.").await;
    let after = s.admin_get("/admin/config").await.json();
    assert_eq!(after["fee_rate_sat_vb"], 7);
    assert_eq!(after["round_duration_seconds"], 90);
    let diff = b
        .wait_js(
            "the config_updated entry",
            "(() => { const r = document.querySelector('#audit-list tr[data-event=config_updated]'); return r && r.textContent; })()",
        )
        .await;
    let diff = diff.as_str().unwrap();
    assert!(
        diff.contains(&format!(
            "fee_rate_sat_vb: {}→ 7",
            before["fee_rate_sat_vb"]
        )) || diff.contains(&format!(
            "fee_rate_sat_vb: {} → 7",
            before["fee_rate_sat_vb"]
        )),
        "{diff}"
    );
    assert!(diff.contains("round_duration_seconds"), "{diff}");
}

/// Pause and resume from the panel, each audited; the players' banner follows.
async fn pause_and_resume_audited(s: &Api, b: &Browser) {
    // Pause and resume, each audited; the players' banner follows.
    b.click("#pause-btn").await;
    b.wait_text("admin-paused-state", "paused").await;
    b.wait_js(
        "the paused entry",
        "document.querySelector('#audit-list tr[data-event=paused]')",
    )
    .await;
    assert_eq!(s.get("/rounds/current", &[]).await.json()["paused"], true);
    b.wait_text("paused-banner", "paused for maintenance").await;
    b.screenshot("admin").await;
    b.click("#resume-btn").await;
    b.wait_text("admin-paused-state", "running").await;
    b.wait_js(
        "the resumed entry",
        "document.querySelector('#audit-list tr[data-event=resumed]')",
    )
    .await;
    let events = b
        .js("return [...document.querySelectorAll('#audit-list tr')].map(r => r.dataset.event);")
        .await;
    assert_eq!(events, json!(["resumed", "paused", "config_updated"]));
    b.wait_js(
        "the banner to go",
        "document.getElementById('paused-banner').hidden",
    )
    .await;
}

/// The verify view's arithmetic, checked against an independent Rust
/// computation of the same rule (DESIGN §4.1) on a made-up round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draw_verification_in_the_browser_matches_the_rule() {
    use sha2::{Digest, Sha256};
    let env = Env::new(Db::Sqlite).await;
    let s = support::spawn_app(&env).await;
    let driver = Driver::start().await;
    let b = driver.browser(&s).await;
    b.open("").await;
    b.wait_js("the scripts", "window.PotluckDraw && window.Potluck")
        .await;

    let round_id: u64 = 4242;
    let block_hash = "0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206";
    let bets = [
        (7u64, "alice", 25_000u64, "aa".repeat(32)),
        (3, "Bob", 10_000, "bb".repeat(32)),
        (12, "carol.x", 65_000, "cc".repeat(32)),
    ];
    let mut ordered = bets.to_vec();
    ordered.sort_by_key(|b| b.0);
    let lines: String = ordered
        .iter()
        .map(|(id, u, a, t)| format!("{id}:{u}:{a}:{t}\n"))
        .collect();
    let commitment = Sha256::digest(lines.as_bytes());
    let mut pre = hex::decode(block_hash).unwrap();
    pre.extend_from_slice(&round_id.to_be_bytes());
    pre.extend_from_slice(&commitment);
    let seed = Sha256::digest(&pre);
    let pot: u64 = bets.iter().map(|b| b.2).sum();
    // 256-bit big-endian mod pot, by long division over the bytes.
    let ticket = seed.iter().fold(0u128, |acc, &byte| {
        ((acc << 8) | u128::from(byte)) % u128::from(pot)
    }) as u64;
    let mut start = 0;
    let mut winner = None;
    for (id, u, a, _) in &ordered {
        if ticket >= start && ticket < start + a {
            winner = Some((*id, u.to_string()));
        }
        start += a;
    }
    let (winner_id, winner_name) = winner.unwrap();
    let mut ranges = std::collections::HashMap::new();
    let mut at = 0;
    for (id, _, a, _) in &ordered {
        ranges.insert(*id, (at, at + a));
        at += a;
    }
    let round = json!({
        "id": round_id, "status": "closed", "pot_sats": pot,
        "draw": {
            "tip_height_at_close": 100, "block_height": 101, "block_hash": block_hash,
            "bets_commitment": hex::encode(commitment), "seed": hex::encode(seed),
            "ticket": ticket, "winner": {"username": winner_name, "bet_id": winner_id},
            "bets": bets.iter().map(|(id, u, a, t)| json!({"bet_id": id, "username": u, "amount_sats": a, "txid": t, "range_start": ranges[id].0, "range_end": ranges[id].1})).collect::<Vec<_>>(),
        }
    });
    let run = |round: Value| {
        let client = b.client.clone();
        async move {
            client
                .execute_async(
                    "const [round, done] = arguments; PotluckDraw.verify(round).then(v => done({ok: v.ok, seed: v.seed, commitment: v.commitment, ticket: String(v.ticket), winner: v.winner.bet_id, failed: v.checks.filter(c => c.ok === false).map(c => c.name)}), e => done({error: String(e)}));",
                    vec![round],
                )
                .await
                .unwrap()
        }
    };
    let v = run(round.clone()).await;
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["seed"], hex::encode(seed));
    assert_eq!(v["commitment"], hex::encode(commitment));
    assert_eq!(v["ticket"], ticket.to_string());
    assert_eq!(v["winner"], winner_id);
    // A published draw that does not follow from its inputs is caught,
    // each forgery by its own check.
    let other = if winner_id == 3 { 7 } else { 3 };
    let forgeries = [
        ("winner", "/draw/winner/bet_id", json!(other)),
        ("bets_commitment", "/draw/bets/0/amount_sats", json!(25_001)),
        ("ranges", "/draw/bets/1/range_end", json!(1)),
        ("seed", "/draw/seed", json!("00".repeat(32))),
    ];
    for (check, pointer, value) in forgeries {
        let mut forged = round.clone();
        *forged.pointer_mut(pointer).unwrap() = value;
        let v = run(forged).await;
        assert_eq!(v["ok"], false, "{check}: {v}");
        assert!(
            v["failed"].as_array().unwrap().contains(&json!(check)),
            "{check}: {v}"
        );
    }

    b.close().await;
    driver.stop().await;
    s.stop().await;
}

/// The server's QR codes (GET /users/me/deposit-qr.svg draws them with
/// the same function) at sizes from version 1 up, shown in the page and
/// decoded by an independent decoder; and the page's CSP is in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qr_codes_of_every_size_decode() {
    let env = Env::new(Db::Sqlite).await;
    let s = support::spawn_app(&env).await;
    let driver = Driver::start().await;
    let b = driver.browser(&s).await;
    b.open("").await;
    b.wait_js("the scripts", "window.Potluck").await;
    for len in [1usize, 14, 26, 42, 62, 84, 106, 122, 152, 180, 213, 256] {
        let text: String = (0..len)
            .map(|i| char::from(b"bcrt1qABCDEFGHJKLMNPQRSTUVWXYZ0123456789:/?&=.-_"[i * 7 % 47]))
            .collect();
        let svg = potluck_rounds::http::qr::svg(&text).unwrap();
        b.client
            .execute(
                "const [text] = arguments; const box = document.createElement('div'); box.id = 'qr-probe';
                 const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
                 box.append(document.importNode(doc.documentElement, true));
                 document.getElementById('qr-probe')?.remove(); document.body.prepend(box);
                 return null;",
                vec![json!(svg)],
            )
            .await
            .unwrap();
        let png = b
            .client
            .find(Locator::Css("#qr-probe svg"))
            .await
            .unwrap()
            .screenshot()
            .await
            .unwrap();
        assert_eq!(decode_qr(&png), text, "{len} bytes");
    }
    assert!(
        potluck_rounds::http::qr::svg(&"x".repeat(257)).is_err(),
        "too long a text is refused"
    );

    // The CSP is in force: an inline script is refused, and reported.
    b.js("const s = document.createElement('script'); s.textContent = 'window.injected = 1'; document.body.append(s); return null;")
        .await;
    let report = b
        .wait_js("the CSP report", "Potluck.errors.join(' ')")
        .await;
    assert!(report.as_str().unwrap().contains("script-src"), "{report}");
    assert_eq!(
        b.js("return window.injected === undefined;").await,
        json!(true)
    );
    b.js("Potluck.errors.length = 0; return null;").await;
    b.close().await;
    driver.stop().await;
    s.stop().await;
}

fn regtest_address(s: &str) -> chain::bitcoin::Address {
    s.parse::<chain::bitcoin::Address<chain::bitcoin::address::NetworkUnchecked>>()
        .unwrap()
        .require_network(chain::bitcoin::Network::Regtest)
        .unwrap()
}

/// Where the tests mine blocks to: nobody of the service (an empty-script P2WSH).
fn nobodys_address() -> chain::bitcoin::Address {
    chain::bitcoin::Address::p2wsh(
        chain::bitcoin::Script::new(),
        chain::bitcoin::KnownHrp::Regtest,
    )
}

/// Polls the API until `f` holds for the JSON at `path` (with `token`).
async fn wait_api(
    s: &Api,
    path: &str,
    token: &str,
    what: &str,
    f: impl Fn(&Value) -> bool,
) -> Value {
    let auth = format!("Bearer {token}");
    let headers: Vec<(&str, &str)> = if token.is_empty() {
        vec![]
    } else {
        vec![("authorization", &auth)]
    };
    wait_for(
        &format!("{what} at {path}"),
        Duration::from_secs(90),
        || async {
            let r = s.get(path, &headers).await;
            (r.status == 200).then(|| r.json()).filter(|v| f(v))
        },
    )
    .await
}

/// The whole player journey on the development chain, without a reload:
/// register, address, a deposit mined by the test, a bet, the countdown,
/// the draw revealed and the balance changed; a second browser that opens
/// after the draw sees the last-round result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_journey_on_the_development_chain() {
    let rig = Rig::new(Db::Sqlite, "40").await;
    let (s, rpc) = (rig.s(), &rig.rpc);
    let driver = Driver::start().await;
    let b = driver.browser(s).await;
    b.open("").await;
    b.wait_text("live-status", "live").await;

    let miner = nobodys_address();
    register_and_deposit(&b, rpc, &miner).await;

    let (bob, bet_round) = both_bet(s, &b).await;

    let winner = round_is_drawn_and_revealed(s, &b, rpc, &miner, bet_round).await;

    balance_follows_the_draw(s, &b, &winner).await;

    draw_is_verified_and_listed(&b, bet_round, &winner).await;

    // Bob opens the page only now, in a separate browser: his last round.
    let b2 = driver.browser(s).await;
    bob_sees_his_last_round(s, &b2, &bob, bet_round, &winner).await;

    bob_uses_the_faucet_button(s, &b2, &bob).await;

    withdraw_form_checks_and_sends(&b, rpc, &miner).await;

    b2.close().await;
    b.close().await;
    driver.stop().await;
    rig.finish().await;
}

/// The journey's start: alice registers in the page and a deposit, sent
/// by the test and mined to `miner`, is credited.
async fn register_and_deposit(
    b: &Browser,
    rpc: &chain::BitcoindRpc,
    miner: &chain::bitcoin::Address,
) {
    // Register in the page; the address appears with its QR code.
    b.submit(
        "#register-form",
        &[
            ("register-username", "alice"),
            ("register-password", "password123"),
        ],
    )
    .await;
    let address = b.wait_text("address", "bcrt1q").await;
    b.wait_text("balance", "0 sats").await;

    // A deposit, sent and mined by the test through the chain's RPC.
    let deposit_txid = rpc
        .send_to_address(
            &regtest_address(&address),
            chain::bitcoin::Amount::from_sat(150_000),
        )
        .await
        .unwrap()
        .to_string();
    rpc.generate_to_address(1, miner).await.unwrap();
    b.wait_text("balance", "150,000 sats (0.00150000 BTC)")
        .await;
    b.wait_js(
        "the deposit in the list",
        &format!("document.querySelector('#tx-list code[data-txid=\"{deposit_txid}\"]')"),
    )
    .await;
    b.screenshot("deposit").await;
}

/// Bob, funded by the faucet, bets through the API and alice in the page, in one round; bob's token and the round.
async fn both_bet(s: &Api, b: &Browser) -> (String, i64) {
    // A second player, funded through the faucet, bets through the API.
    let bob = s.user("bob", "10.0.0.2").await;
    let bob_auth = format!("Bearer {bob}");
    let r = s
        .post("/dev/faucet", &[("authorization", &bob_auth)], json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_api(s, "/users/me", &bob, "bob's faucet coins", |v| {
        v["balance_sats"].as_i64() > Some(0)
    })
    .await;

    // Alice bets in the page; the pot and the pending state follow.
    // Bet early in a round, so that both bets land in the same one.
    b.wait_js(
        "an open round with time to bet",
        "Potluck.state.round && Potluck.state.round.status === 'open' && Number(document.getElementById('countdown').dataset.secondsLeft) >= 25",
    )
    .await;
    b.fill("bet-amount", "20000").await;
    b.wait_text("bet-preview", "20,000 sats (0.00020000 BTC)")
        .await;
    b.click("#bet-btn").await;
    b.wait_text("notice", "Bet of 20,000 sats").await;
    b.wait_js(
        "you played",
        "document.getElementById('you-played').offsetParent !== null",
    )
    .await;
    b.wait_text("pending-indicator", "in flight").await;
    let r = s
        .post(
            "/rounds/current/bets",
            &[("authorization", &bob_auth)],
            json!({"amount_sats": 30000}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let bet_round = r.json()["round_id"].as_i64().unwrap();
    b.wait_text("pot", "50,000 sats").await;
    b.wait_text("bettors", "2").await;
    (bob, bet_round)
}

/// The countdown runs, the round closes, is drawn and paid out, and the page reveals the draw; the winner.
async fn round_is_drawn_and_revealed(
    s: &Api,
    b: &Browser,
    rpc: &chain::BitcoindRpc,
    miner: &chain::bitcoin::Address,
    bet_round: i64,
) -> String {
    // The countdown runs down to the server's closes_at.
    let first = b
        .wait_js(
            "countdown",
            "Number(document.getElementById('countdown').dataset.secondsLeft)",
        )
        .await;
    let first = first.as_i64().unwrap();
    b.wait_js(
        "the countdown to move",
        &format!("Number(document.getElementById('countdown').dataset.secondsLeft) < {first}"),
    )
    .await;
    assert!(first <= 40, "{first}");
    b.screenshot("round").await;
    // Closed: the draw waits for the first block above the tip at close.
    wait_api(
        s,
        &format!("/rounds/{bet_round}"),
        "",
        "the round to close",
        |v| v["status"] != "open" && !v["draw"]["tip_height_at_close"].is_null(),
    )
    .await;
    rpc.generate_to_address(1, miner).await.unwrap();
    let drawn = wait_api(
        s,
        &format!("/rounds/{bet_round}"),
        "",
        "the draw and the payout broadcast",
        |v| !v["draw"]["winner"].is_null() && v["payout"]["status"] == "broadcast",
    )
    .await;
    // Confirm the payout.
    rpc.generate_to_address(1, miner).await.unwrap();
    wait_api(
        s,
        &format!("/rounds/{bet_round}"),
        "",
        "the payout to confirm",
        |v| v["payout"]["status"] == "confirmed",
    )
    .await;
    let winner = drawn["draw"]["winner"]["username"]
        .as_str()
        .unwrap()
        .to_string();
    b.wait_text("reveal-winner", &winner).await;
    b.wait_text("reveal-ticket", &drawn["draw"]["ticket"].to_string())
        .await;
    b.wait_js(
        "the reveal of the bet round",
        &format!("document.getElementById('reveal').dataset.roundId === '{bet_round}'"),
    )
    .await;
    winner
}

/// Alice's balance follows the draw in the page without a reload.
async fn balance_follows_the_draw(s: &Api, b: &Browser, winner: &str) {
    // The balance moved without a reload: it is what the API says, and not
    // what it was before the bet.
    let alice_token = b
        .js("return sessionStorage.getItem('potluck.token');")
        .await;
    let alice_token = alice_token.as_str().unwrap().to_string();
    let won = winner == "alice";
    let settled = wait_api(
        s,
        "/users/me",
        &alice_token,
        "alice's balance to settle",
        |v| {
            !v["has_pending"].as_bool().unwrap_or(true)
                && (!won || v["balance_sats"].as_i64() > Some(150_000 - 20_000))
        },
    )
    .await;
    let balance = settled["balance_sats"].as_i64().unwrap();
    assert_ne!(balance, 150_000);
    b.wait_js(
        "the balance to update",
        &format!("document.getElementById('balance').dataset.sats === '{balance}'"),
    )
    .await;
    b.wait_js(
        "the pending indicator to go",
        "document.getElementById('pending-indicator').hidden",
    )
    .await;
    if winner == "alice" {
        assert!(balance > 150_000 - 20_000, "{balance}");
    } else {
        assert!(balance < 150_000 - 20_000, "{balance}");
    }
    b.wait_text("reveal-payout", "confirmed").await;
    b.screenshot("reveal").await;
}

/// The verify view recomputes the published draw, and the recent rounds list links to it.
async fn draw_is_verified_and_listed(b: &Browser, bet_round: i64, winner: &str) {
    b.click("#verify-link").await;
    b.wait_js(
        "verification",
        "document.getElementById('verify-result').dataset.ok",
    )
    .await;
    assert_eq!(
        b.js("return document.getElementById('verify-result').dataset.ok;")
            .await,
        json!("true")
    );
    let winner_row = b
        .js("return document.querySelector('#verify-ranges tr.winner').textContent;")
        .await;
    assert!(
        winner_row.as_str().unwrap().contains(winner),
        "{winner_row}"
    );
    b.screenshot("verify").await;

    // The recent rounds list links the drawn round to its verify view.
    b.open("#/rounds").await;
    b.wait_js(
        "the drawn round in the list",
        &format!("document.querySelector('#rounds-list a[href=\"#/verify/{bet_round}\"]')"),
    )
    .await;
    let row = b
        .js(&format!("return document.querySelector('#rounds-list a[href=\"#/verify/{bet_round}\"]').closest('tr').textContent;"))
        .await;
    assert!(row.as_str().unwrap().contains(winner), "{row}");
    b.screenshot("rounds").await;
}

/// Bob, opening the page after the draw, sees his last round's result.
async fn bob_sees_his_last_round(s: &Api, b2: &Browser, bob: &str, bet_round: i64, winner: &str) {
    b2.open("").await;
    b2.submit(
        "#login-form",
        &[("login-username", "bob"), ("login-password", "password123")],
    )
    .await;
    let last = wait_api(
        s,
        "/users/me/last-round-result",
        bob,
        "bob's result",
        |_| true,
    )
    .await;
    assert_eq!(last["round_id"].as_i64(), Some(bet_round));
    let outcome = last["outcome"].as_str().unwrap();
    assert_eq!(outcome, if winner == "bob" { "won" } else { "lost" });
    b2.wait_js(
        "the last-round result",
        &format!("document.getElementById('last-result').dataset.roundId === '{bet_round}' && document.getElementById('last-result').offsetParent !== null"),
    )
    .await;
    let text = b2.text("last-outcome").await;
    assert!(
        text.contains(if outcome == "won" {
            "You won"
        } else {
            "did not win"
        }),
        "{text}"
    );
    b2.screenshot("last-result").await;
}

/// Bob gets test coins with the page's button: credited without a reload.
async fn bob_uses_the_faucet_button(s: &Api, b2: &Browser, bob: &str) {
    // Bob gets test coins with the page's button: credited without reload.
    let bob_before = wait_api(s, "/users/me", bob, "bob's balance", |_| true).await["balance_sats"]
        .as_i64()
        .unwrap();
    b2.click("#faucet-btn").await;
    let paid = b2.wait_text("faucet-result", "1,000,000 sats").await;
    let expected = bob_before + 1_000_000;
    b2.wait_js(
        "bob's new balance",
        &format!("document.getElementById('balance').dataset.sats === '{expected}'"),
    )
    .await;
    assert!(paid.contains("txid"), "{paid}");
}

/// The withdraw form shows address errors inline, then sends a valid withdrawal that the test confirms.
async fn withdraw_form_checks_and_sends(
    b: &Browser,
    rpc: &chain::BitcoindRpc,
    miner: &chain::bitcoin::Address,
) {
    b.open("#/").await;
    b.submit(
        "#withdraw-form",
        &[
            (
                "withdraw-address",
                "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu",
            ),
            ("withdraw-amount", "5000"),
        ],
    )
    .await;
    b.wait_text("withdraw-address-error", "another network")
        .await;
    b.submit(
        "#withdraw-form",
        &[("withdraw-address", "bcrt1qnot-an-address")],
    )
    .await;
    b.wait_text("withdraw-address-error", "not a valid address")
        .await;
    // A valid withdrawal: broadcast, listed with its txid, the pending
    // indicator on until the test mines it.
    b.submit(
        "#withdraw-form",
        &[
            ("withdraw-address", &miner.to_string()),
            ("withdraw-amount", "10000"),
        ],
    )
    .await;
    let sent = b.wait_text("withdraw-result", "Withdrawal broadcast").await;
    assert!(!b.visible("withdraw-address-error").await);
    let txid: String = sent
        .rsplit("txid ")
        .next()
        .unwrap()
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    assert_eq!(txid.len(), 64, "{sent}");
    b.wait_js(
        "the withdrawal in the list",
        &format!("document.querySelector('#tx-list tr[data-kind=withdrawal] code[data-txid=\"{txid}\"]')"),
    )
    .await;
    b.wait_text("pending-indicator", "in flight").await;
    rpc.generate_to_address(1, miner).await.unwrap();
    b.wait_js(
        "the withdrawal confirmed",
        "document.getElementById('pending-indicator').hidden && document.querySelector('#tx-list tr[data-kind=withdrawal]').dataset.status === 'confirmed'",
    )
    .await;
}

/// The operator's side of a refused payout: the round shows up under
/// "Failed payouts", the operator lowers the fee rate in the config form and
/// presses "Retry payout"; the audit log shows both entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_retries_a_refused_payout_in_the_browser() {
    let rig = Rig::new(Db::Sqlite, "30").await;
    let (s, rpc) = (rig.s(), &rig.rpc);
    let miner = nobodys_address();
    let (kate, liam) = two_players_with_faucet_coins(s).await;
    let driver = Driver::start().await;
    let b = driver.browser(s).await;
    b.open("").await;
    b.wait_js(
        "an open round with time to bet",
        "Potluck.state.round && Potluck.state.round.status === 'open' && Number(document.getElementById('countdown').dataset.secondsLeft) >= 15",
    )
    .await;
    let id = four_bets_in_one_round(s, &kate, &liam).await;

    b.open("#/admin").await;
    b.submit("#admin-login", &[("admin-token", ADMIN)]).await;
    b.wait_js(
        "config form",
        "document.getElementById('cfg-fee_rate_sat_vb')",
    )
    .await;
    b.submit("#config-form", &[("cfg-fee_rate_sat_vb", "10000")])
        .await;
    b.wait_text("config-saved", "Saved.").await;

    wait_api(s, &format!("/rounds/{id}"), "", "drawing", |v| {
        v["status"] == "drawing"
    })
    .await;
    rpc.generate_to_address(1, &miner).await.unwrap();
    let failed = wait_api(s, &format!("/rounds/{id}"), "", "the refused payout", |v| {
        v["payout"]["status"] == "broadcast_failed"
    })
    .await;
    b.wait_js(
        "the failed payout listed",
        &format!("document.querySelector('#payout-failures li[data-round-id=\"{id}\"] button')"),
    )
    .await;
    b.wait_js(
        "the payout_failed entry",
        "document.querySelector('#audit-list tr[data-event=payout_failed]')",
    )
    .await;
    b.screenshot("admin-payout-failed").await;

    retry_with_a_sane_fee_rate(s, &b, id, &failed).await;

    b.close().await;
    driver.stop().await;
    rig.finish().await;
}

/// Kate and liam, each with two faucet payments of 0.5 BTC; their tokens.
async fn two_players_with_faucet_coins(s: &Api) -> (String, String) {
    let kate = s.user("kate", "10.0.6.1").await;
    let liam = s.user("liam", "10.0.6.2").await;
    for t in [&kate, &liam] {
        for _ in 0..2 {
            let r = s
                .post(
                    "/dev/faucet",
                    &[("authorization", &format!("Bearer {t}"))],
                    json!({"amount_sats": 50_000_000}),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    (kate, liam)
}

/// Four bets of 0.3 BTC in one round, each spending one deposit; the round.
async fn four_bets_in_one_round(s: &Api, kate: &str, liam: &str) -> i64 {
    // Four bets, each spending one deposit: the payout has four inputs, so
    // its real vsize is below the wallet's estimate and 10,000 sat/vB
    // overshoots the chain's 0.10 BTC/kvB maxfeerate: the broadcast is refused.
    let mut round_id = None;
    for t in [&kate, &liam, &kate, &liam] {
        let r = s
            .post(
                "/rounds/current/bets",
                &[("authorization", &format!("Bearer {t}"))],
                json!({"amount_sats": 30_000_000}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        let id = r.json()["round_id"].as_i64().unwrap();
        assert_eq!(*round_id.get_or_insert(id), id, "one round");
    }

    round_id.unwrap()
}

/// A sane fee rate, then the retry from the panel: paid once, audited, gone from the list; a second retry is refused.
async fn retry_with_a_sane_fee_rate(s: &Api, b: &Browser, id: i64, failed: &Value) {
    // A sane fee rate, then the retry: paid once, audited, gone from the list.
    b.submit("#config-form", &[("cfg-fee_rate_sat_vb", "2")])
        .await;
    b.wait_text("config-saved", "Saved.").await;
    b.click(&format!(
        "#payout-failures li[data-round-id=\"{id}\"] button"
    ))
    .await;
    b.wait_text("notice", &format!("Payout of round {id} retried."))
        .await;
    b.wait_js(
        "the payout_retried entry",
        "document.querySelector('#audit-list tr[data-event=payout_retried]')",
    )
    .await;
    b.wait_js(
        "the list to empty",
        "document.querySelectorAll('#payout-failures li').length === 0 && !document.getElementById('payout-failures-empty').hidden",
    )
    .await;
    let closed = wait_api(s, &format!("/rounds/{id}"), "", "the round to close", |v| {
        v["status"] == "closed"
    })
    .await;
    assert_eq!(closed["payout"]["status"], "broadcast");
    assert_ne!(closed["payout"]["txid"], failed["payout"]["txid"]);
    let r = s
        .admin_post(&format!("/admin/rounds/{id}/retry-payout"), json!({}))
        .await;
    assert_eq!(r.status, 409, "a second retry is refused");
}
