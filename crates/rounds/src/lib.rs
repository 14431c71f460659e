//! The round-based custodial wallet HTTP service (seed 001): accounts, sessions, login throttle, registration quota, admin, audit, rounds and the live stream.
//!
//! Entry point: [`Application::build`] with a [`Config`], then
//! [`Application::run_until_stopped`].
//!
//! # The rule
//! Dependencies point one way: [`http`] → [`service`] → {[`store`],
//! [`domain`]}, with [`security`] beside the services (used by them and by
//! the HTTP extractors, never using either). A module never imports from a
//! layer above it, and `http` never reaches past the services: no handler or
//! extractor touches the store (its state holds services, not a database),
//! and no view is built from a store row: the store decodes its rows at its
//! edge into domain records (a round's [`domain::phase::RoundPhase`] with
//! typed hashes, a [`domain::transfer::Transfer`]), which the services
//! return and `http/views.rs` renders; only [`service::StoreError`] is
//! re-exported by the service, and no service field or return value holds
//! a store row. Txids are [`bitcoin::Txid`] and block hashes
//! [`bitcoin::BlockHash`] from the row read to the view (the audit log
//! aside, which quotes what it records as stored), and the
//! draw's raw columns never leave `store/rounds.rs`: the engine writes a
//! [`domain::phase::DrawResult`]. No service holds bytes rendered for HTTP.
//! The domain knows nothing of axum, sqlx or tokio; the store knows nothing
//! of HTTP nor of `security` (the throttle's shared record and clock are
//! domain types); the services return their own
//! typed errors ([`service::accounts::AccountError`],
//! [`service::payments::PaymentError`], …) that `http/error.rs` maps to
//! status codes and error codes. [`app`] wires the layers together and is
//! the only module that sees them all. A test at the bottom of this file
//! checks the rule on the sources.
//!
//! # A short tour
//! - [`domain`]: `phase` (a round's phase with the draw data that exists
//!   in it, its bets and payout, as the views read them), `transfer`,
//!   `ledger` (the conservation totals), `lockout` (the throttle's shared
//!   failure record), `round` (the [`domain::round::RoundStatus`],
//!   [`domain::round::TransferKind`] and [`domain::round::TransferStatus`]
//!   states), `draw` (the provably fair draw as pure functions), `spend`
//!   (building and signing bets, withdrawals and payouts), `money` (the
//!   records they produce), `settings` (what an admin can change, and the
//!   typed diff the audit log keeps), `audit` (the typed details of audit
//!   entries), `address`, `time`.
//! - [`store`]: all SQL, one file per aggregate — `users`, `rounds`,
//!   `ledger` (outputs and transfers), `chain` (processed blocks, deposits,
//!   reorganisations), `settings` (config row and audit log), `idempotency` (the
//!   `Idempotency-Key`s of money requests), `migrations`.
//!   States are bound as their enums and parsed back at this edge.
//! - [`service`]: `accounts` (register, login, sessions, password changes
//!   and the admin reset, applying the throttle and the quota), `admin` (the
//!   config and its audited changes, pause, the audit log, the payout retry,
//!   the ledger totals), `cashier` (bets, withdrawals and the faucet as the
//!   HTTP layer calls them), `payments` (the one bet/withdraw workflow:
//!   select coins, sign, write the intent, broadcast, notify), `engine` (the
//!   chain watcher and the round lifecycle, one durable step at a time),
//!   `history` (rounds and transfers read back), `current` (the cached
//!   current round), `stream` (the live-update hub), `health` (readiness).
//! - [`security`]: `password` (Argon2 on the blocking pool), `token`
//!   (session tokens), `admin_key`, `throttle` (login), `quota` (registration).
//! - [`http`]: one file per resource — `accounts`, `rounds`, `wallet`,
//!   `admin`, `ops`, `dashboard` — plus `extract` (authentication
//!   extractors), `client_ip`, `error` (the error bodies, their typed
//!   `params`, and the mapping of service errors), `codes` (every error
//!   code), `views` (the typed JSON of rounds, draws, payouts and
//!   transfers), `state`, `metrics`, `qr`, and the router in `http/mod.rs`.
//! - [`app`]: [`Application`] (build, bind, serve, graceful shutdown);
//!   [`config`]: [`Config`]; [`server`]: the hyper-util server and its limits.

pub mod app;
pub mod config;
pub mod domain;
pub mod http;
pub mod security;
pub mod server;
pub mod service;
pub mod store;

pub use app::{Application, StartupError};
pub use config::{ChainSource, Config};

#[cfg(test)]
mod layering {
    //! The rule above, checked on the source: a module that breaks it fails here.

    use std::path::Path;

    fn sources(dir: &str) -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
        let mut files: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no sources under {}", root.display());
        files
            .into_iter()
            .map(|p| {
                (
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn http_never_reaches_the_store() {
        for (file, text) in sources("http") {
            for needle in [
                "crate::store",
                "super::store",
                ".store.",
                ".store)",
                "&state.store",
            ] {
                assert!(
                    !text.contains(needle),
                    "{file} uses the store (`{needle}`): go through a service"
                );
            }
        }
    }

    #[test]
    fn the_domain_knows_no_io() {
        for (file, text) in sources("domain") {
            for needle in [
                "axum::",
                "sqlx::",
                "tokio::",
                "crate::store",
                "crate::service",
                "crate::http",
            ] {
                assert!(
                    !text.contains(needle),
                    "{file} imports `{needle}`: the domain is pure"
                );
            }
        }
    }

    /// The `pub` types the store defines (its rows and records), errors aside.
    fn store_types() -> Vec<String> {
        let mut names = Vec::new();
        for (file, text) in sources("store") {
            if file.ends_with("tests.rs") {
                continue;
            }
            for line in text.lines().map(str::trim) {
                for kw in ["pub struct ", "pub enum ", "pub type "] {
                    if let Some(rest) = line.strip_prefix(kw) {
                        let name: String = rest
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !name.ends_with("Error") && name != "Store" && name != "Backend" {
                            names.push(name);
                        }
                    }
                }
            }
        }
        names
    }

    /// Whether `text` names `ty` as a type: a whole word, not a variant or
    /// an associated item of another type (`TransferKind::Deposit`).
    fn names_type(text: &str, ty: &str) -> bool {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        text.match_indices(ty).any(|(i, _)| {
            let before = &text[..i];
            let after = &text[i + ty.len()..];
            if before.chars().next_back().is_some_and(word)
                || after.chars().next().is_some_and(word)
            {
                return false;
            }
            match before.strip_suffix("::") {
                Some(path) => {
                    let segment: String = path
                        .chars()
                        .rev()
                        .take_while(|c| word(*c))
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    !segment.starts_with(char::is_uppercase)
                }
                None => true,
            }
        })
    }

    #[test]
    fn http_views_are_built_from_domain_and_service_types_not_store_rows() {
        let rows = store_types();
        assert!(
            rows.iter().any(|r| r == "UserRow"),
            "the scan finds the store's rows: {rows:?}"
        );
        let mut leaks = Vec::new();
        for (file, text) in sources("http") {
            // What the code names, not what its comments say.
            let text: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for row in &rows {
                if names_type(&text, row) {
                    leaks.push(format!("{file}: {row}"));
                }
            }
        }
        for (file, text) in sources("service") {
            for line in text
                .lines()
                .filter(|l| l.trim_start().starts_with("pub use crate::store"))
            {
                if line.trim() != "pub use crate::store::StoreError;" {
                    leaks.push(format!("{file} re-exports a store type: {}", line.trim()));
                }
            }
        }
        assert!(
            leaks.is_empty(),
            "HTTP sees store rows (build the view from a domain or service type): {leaks:?}"
        );
    }

    #[test]
    fn the_store_knows_no_security() {
        for (file, text) in sources("store") {
            if file.ends_with("tests.rs") {
                continue;
            }
            assert!(
                !text.contains("crate::security"),
                "{file} imports `crate::security`: the store keeps domain records, the policy stays above it"
            );
        }
    }

    #[test]
    fn services_keep_typed_values_not_rendered_bytes() {
        for (file, text) in sources("service") {
            for needle in ["crate::http", "bytes::Bytes", "axum::body::Bytes", "Render"] {
                assert!(
                    !text.contains(needle),
                    "{file} holds `{needle}`: a service returns typed values, HTTP renders them"
                );
            }
        }
    }

    #[test]
    fn http_repeats_no_config_bound() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http/admin.rs"),
        )
        .unwrap();
        // The unit tests may name the values the rule refuses.
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for needle in [
            "10_000",
            "604_800",
            "DUST_LIMIT_SATS",
            "MAX_MONEY_SATS",
            "1, 100",
        ] {
            assert!(
                !text.contains(needle),
                "http/admin.rs spells the config bound `{needle}`: the bounds live in the domain's ConfigPatch"
            );
        }
    }

    /// Fields on the way from the store to the views that hold a txid,
    /// hash, seed or commitment as text (`file:line`).
    fn hashes_as_text(file: &str, text: &str) -> Vec<String> {
        let hashy = |name: &str| {
            name == "txid"
                || name.ends_with("_txid")
                || name == "seed"
                || name.ends_with("commitment")
                || (name.contains("hash") && name != "password_hash")
        };
        text.lines()
            .enumerate()
            .filter_map(|(i, line)| {
                let (name, ty) = line.trim().trim_start_matches("pub ").split_once(':')?;
                let ty = ty.trim().trim_end_matches(',');
                let textual = ["String", "Option<String>", "&str", "Option<&str>"];
                (hashy(name.trim()) && (textual.contains(&ty) || ty.starts_with("&'")))
                    .then(|| format!("{file}:{}", i + 1))
            })
            .collect()
    }

    /// The source files of the modules `text` imports from the crate
    /// (`use crate::a::b::…` → `a/b.rs`), the HTTP layer's own aside.
    fn imported_files(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("use crate::")
                    .or_else(|| l.trim().strip_prefix("pub use crate::"))
            })
            .filter(|path| !path.starts_with("http::"))
            .filter_map(|path| {
                let segments: Vec<&str> = path.split("::").collect();
                (segments.len() >= 3).then(|| format!("{}/{}.rs", segments[0], segments[1]))
            })
            .collect()
    }

    #[test]
    fn round_and_transfer_views_are_built_from_typed_txids_and_hashes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let views = std::fs::read_to_string(root.join("http/views.rs")).unwrap();
        // What the views are built from, and what those modules re-export.
        let mut files = imported_files(&views);
        for file in files.clone() {
            let text = std::fs::read_to_string(root.join(&file)).unwrap();
            files.extend(
                text.lines()
                    .filter(|l| l.trim().starts_with("pub use crate::"))
                    .flat_map(imported_files),
            );
        }
        files.sort();
        files.dedup();
        let found: Vec<String> = files
            .iter()
            .flat_map(|file| {
                let text = std::fs::read_to_string(root.join(file)).unwrap();
                hashes_as_text(file, &text)
            })
            .collect();
        assert!(
            found.is_empty(),
            "the views are built from txids and hashes held as text (decode them at the store's edge): {found:?}"
        );
    }

    #[test]
    fn the_scan_finds_a_txid_held_as_text() {
        let text = "pub struct A {\n    pub txid: String,\n    pub block_hash: Option<String>,\n    \
                    pub password_hash: String,\n    pub seed: [u8; 32],\n    pub old_txid: &'a str,\n}";
        assert_eq!(
            hashes_as_text("f", text),
            vec!["f:2".to_string(), "f:3".to_string(), "f:6".to_string()]
        );
        assert!(names_type("use x::RoundDetail;", "RoundDetail"));
        assert_eq!(
            imported_files("use crate::domain::phase::{Bet, Round};\nuse crate::http::error::ApiError;\npub use crate::store::ledger::TransferRow;\nuse std::fmt;"),
            vec!["domain/phase.rs".to_string(), "store/ledger.rs".to_string()]
        );
        assert!(!names_type("TransferKind::Deposit", "Deposit"));
        assert!(!names_type("RoundDetails", "RoundDetail"));
    }

    /// `text` without its unit tests, its comment lines blanked (lines keep
    /// their numbers): what the module's code names.
    fn code_of(text: &str) -> String {
        text.split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What follows `pub ` or `pub(crate) ` on `line`, if it declares a public item.
    fn public_item(line: &str) -> Option<&str> {
        let l = line.trim();
        l.strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
    }

    /// The `pub` fields and the return types of the `pub` functions in
    /// `text` (`pub(crate)` included: HTTP is in the crate), each as
    /// `(line, text)`.
    fn public_surface(text: &str) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = public_item(line) else {
                continue;
            };
            if rest.starts_with("fn ") || rest.starts_with("async fn ") {
                // The signature runs to its body or its `;`.
                let sig: String = lines[i..]
                    .iter()
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join(" ");
                let sig = sig.split(['{', ';']).next().unwrap_or_default();
                if let Some((_, ret)) = sig.split_once("->") {
                    found.push((i + 1, ret.trim().to_string()));
                }
            } else if let Some((name, ty)) = rest.split_once(':') {
                if name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    found.push((i + 1, ty.trim().to_string()));
                }
            }
        }
        found
    }

    #[test]
    fn services_hand_http_domain_records_not_store_rows() {
        // A service field or return value that holds a store row lets HTTP
        // read the row field by field without ever naming its type.
        let rows = store_types();
        let mut leaks = Vec::new();
        for (file, text) in sources("service") {
            for (line, ty) in public_surface(&code_of(&text)) {
                for row in &rows {
                    if names_type(&ty, row) {
                        leaks.push(format!("{file}:{line}: {row} in `{ty}`"));
                    }
                }
            }
        }
        assert!(
            leaks.is_empty(),
            "services hand out store rows (decode them into domain records): {leaks:?}"
        );
    }

    #[test]
    fn txids_are_typed_above_the_store() {
        let mut found = Vec::new();
        for dir in ["domain", "service"] {
            for (file, text) in sources(dir) {
                // The audit log quotes what it records as stored, also the
                // txid of a transfer set aside because it does not decode.
                if file.ends_with("domain/audit.rs") {
                    continue;
                }
                let code = code_of(&text);
                let lines: Vec<&str> = code.lines().collect();
                // Txids only: block hashes are checked below
                // (`block_hashes_are_typed_above_the_store`).
                found.extend(hashes_as_text(&file, &code).into_iter().filter(|at| {
                    at.rsplit(':')
                        .next()
                        .and_then(|n| n.parse::<usize>().ok())
                        .and_then(|n| lines.get(n - 1))
                        .is_some_and(|l| l.contains("txid"))
                }));
            }
        }
        // HTTP renders the JSON text from a typed txid, never passes text on.
        for (file, text) in sources("http") {
            for (i, line) in code_of(&text).lines().enumerate() {
                let l = line.trim();
                let assigns = ["txid:", "txid =", "txid.clone()"]
                    .iter()
                    .any(|n| l.contains(n));
                let declares = l.starts_with("pub ") || l.starts_with("let ");
                if assigns && !declares && !l.contains("to_string()") {
                    found.push(format!("{file}:{}: {l}", i + 1));
                }
            }
        }
        assert!(
            found.is_empty(),
            "txids held or passed on as text above the store (decode them where the row is read): {found:?}"
        );
    }

    /// Whether `name` (a field, parameter or function) speaks of a block
    /// hash or a tip: a password hash and a txid are other things.
    fn names_a_block_hash(name: &str) -> bool {
        (name.contains("hash") || name.contains("tip"))
            && !name.contains("password")
            && !name.contains("txid")
    }

    /// Splits `list` at its top-level commas (not those inside `()`, `<>`, `[]`).
    fn top_level_items(list: &str) -> Vec<&str> {
        let mut items = Vec::new();
        let (mut depth, mut start) = (0i32, 0);
        for (i, c) in list.char_indices() {
            match c {
                '(' | '<' | '[' => depth += 1,
                ')' | '>' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&list[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&list[start..]);
        items
    }

    /// The `pub` functions in `text` that take or return as text what
    /// `names` recognises (`file:line: fn name`): a parameter so named, or
    /// the result of a function so named, typed `str` or `String`.
    fn text_in_signatures(file: &str, text: &str, names: fn(&str) -> bool) -> Vec<String> {
        let textual = |ty: &str| ty.contains("str") || ty.contains("String");
        let lines: Vec<&str> = text.lines().collect();
        let mut found = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = public_item(line) else {
                continue;
            };
            let Some(rest) = rest
                .strip_prefix("async fn ")
                .or_else(|| rest.strip_prefix("fn "))
            else {
                continue;
            };
            let sig: String = std::iter::once(rest)
                .chain(lines[i + 1..].iter().map(|l| l.trim()))
                .collect::<Vec<_>>()
                .join(" ");
            let sig = sig.split(['{', ';']).next().unwrap_or_default();
            let Some((name, after)) = sig.split_once('(') else {
                continue;
            };
            let (params, ret) = after.split_once("->").unwrap_or((after, ""));
            let params = params.trim().trim_end_matches(')');
            let takes_text = top_level_items(params).iter().any(|p| {
                p.split_once(':')
                    .is_some_and(|(n, ty)| names(n.trim()) && textual(ty))
            });
            let returns_text = names(name) && textual(ret);
            if takes_text || returns_text {
                found.push(format!("{file}:{}: fn {name}", i + 1));
            }
        }
        found
    }

    #[test]
    fn block_hashes_are_typed_above_the_store() {
        let mut found = Vec::new();
        // The store's API takes and returns `BlockHash` (and `Txid`): it
        // decodes at its edge.
        for (file, text) in sources("store") {
            if file.ends_with("tests.rs") {
                continue;
            }
            let code = code_of(&text);
            found.extend(text_in_signatures(&file, &code, names_a_block_hash));
            found.extend(text_in_signatures(&file, &code, |n| n.contains("txid")));
        }
        for dir in ["domain", "service", "http"] {
            for (file, text) in sources(dir) {
                let code = code_of(&text);
                found.extend(text_in_signatures(&file, &code, names_a_block_hash));
                for (i, line) in code.lines().enumerate() {
                    let l = line.trim();
                    // A field, parameter or local holding a hash as text.
                    let held =
                        l.trim_start_matches("pub ")
                            .split_once(':')
                            .is_some_and(|(name, ty)| {
                                let ty = ty.trim().trim_end_matches(',');
                                names_a_block_hash(name.trim())
                                    && !name.contains(' ')
                                    && ["String", "Option<String>", "&str", "Option<&str>"]
                                        .contains(&ty)
                            });
                    // A hash turned into text to be passed on: only the
                    // views render one, at their edge (the JSON).
                    let rendered = dir != "http"
                        && names_a_block_hash(l)
                        && l.contains(".to_string()")
                        && !l.contains("tracing::");
                    if (held && !(dir == "http" && l.starts_with("pub "))) || rendered {
                        found.push(format!("{file}:{}: {l}", i + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "block hashes (and the store's txids) held or passed on as text above the store (use bitcoin::BlockHash and Txid; the store decodes at its edge): {found:?}"
        );
    }

    #[test]
    fn the_block_hash_scan_finds_text_in_a_signature() {
        let text = "pub async fn synced_tip(&self) -> Result<Option<(i64, String)>, E> {\n}\n\
                    pub fn anchor(\n    id: i64,\n    tip: (i64, &str),\n) -> bool;\n\
                    pub fn set_password(password_hash: &str) {}\n\
                    pub fn typed(hash: BlockHash, f: impl Fn(&[u8]) -> String) -> Option<BlockHash> {}";
        assert_eq!(
            text_in_signatures("f", text, names_a_block_hash),
            vec![
                "f:1: fn synced_tip".to_string(),
                "f:3: fn anchor".to_string()
            ]
        );
    }

    #[test]
    fn draw_columns_stay_in_the_store() {
        let mut leaks = Vec::new();
        for dir in ["domain", "service", "http"] {
            for (file, text) in sources(dir) {
                if names_type(&code_of(&text), "DrawColumns") {
                    leaks.push(file);
                }
            }
        }
        let rounds = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/rounds.rs"),
        )
        .unwrap();
        if rounds.contains("pub struct DrawColumns") {
            leaks.push("store/rounds.rs exports DrawColumns".to_string());
        }
        assert!(
            leaks.is_empty(),
            "the draw's raw columns leave the store (speak RoundPhase and the draw's domain types): {leaks:?}"
        );
    }

    #[test]
    fn the_surface_scan_finds_a_row_in_a_field_and_a_return_type() {
        let text = "pub struct Bumped {\n    pub transfer: TransferRow,\n    done: bool,\n}\n\
                    pub(crate) async fn retry(\n    &self,\n) -> Result<Option<TransferRow>, E> {\n}\n\
                    fn private() -> TransferRow {}";
        assert_eq!(
            public_surface(text),
            vec![
                (2, "TransferRow,".to_string()),
                (5, "Result<Option<TransferRow>, E>".to_string())
            ]
        );
        assert_eq!(code_of("a\n// b\nd\n#[cfg(test)]\nc"), "a\n\nd");
    }

    // That no error prints the cause it chains is checked for this crate and the node's
    // together: `crates/node/src/error_scan_tests.rs`.
}
