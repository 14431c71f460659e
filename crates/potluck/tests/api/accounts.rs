//! Black-box: registration, login, sessions and tokens, change-password, over HTTP against the service in this process (SQLite and PostgreSQL); the one test that reads the log starts the binary.

use crate::support;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use support::{Api, Db, Env};

both_databases!(
    registration_rules_and_login,
    concurrent_case_variants_register_once,
    tokens_are_checked_strictly,
    change_password_rotates_sessions,
    unparseable_stored_hash_is_a_wrong_password,
);

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn sign(secret: &[u8], header: &str, claims: serde_json::Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret).unwrap();
    mac.update(input.as_bytes());
    format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

async fn registration_rules_and_login(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let r = s.register("Bob.Smith-1", "password123", "10.0.0.1").await;
    assert_eq!(r.status, 201, "{}", r.text());
    let body = r.json();
    assert_eq!(body["username"], "Bob.Smith-1", "stored and shown as typed");
    let address = body["address"].as_str().unwrap().to_string();
    assert!(address.starts_with("bcrt1q"), "{address}");
    // Unique ignoring case; a taken name is 409 username_taken.
    let r = s.register("bob.smith-1", "password123", "10.0.0.2").await;
    assert_eq!((r.status, r.code()), (409, "username_taken".into()));
    // Validation: 422 with the rule as code.
    for (name, pw, code) in [
        ("", "password123", "username_too_short"),
        ("ab", "password123", "username_too_short"),
        (&"x".repeat(33) as &str, "password123", "username_too_long"),
        ("has space", "password123", "username_invalid_characters"),
        ("émile", "password123", "username_invalid_characters"),
        ("carol", "1234567", "password_too_short"),
    ] {
        let r = s.register(name, pw, "10.0.0.3").await;
        assert_eq!(
            (r.status, r.code()),
            (422, code.to_string()),
            "{name:?}: {}",
            r.text()
        );
        let d = &r.json()["detail"];
        assert!(d["message"].is_string() && d["params"].is_object());
    }
    assert_eq!(
        s.register(&"y".repeat(32), "password123", "10.0.0.3")
            .await
            .status,
        201
    );
    // Password length counts code points: 8 two-byte characters pass.
    assert_eq!(
        s.register("umlaut", "ääääääää", "10.0.0.3").await.status,
        201
    );
    let r = s
        .post("/auth/register", &[], json!({"username": "x"}))
        .await;
    assert_eq!((r.status, r.code()), (422, "invalid_body".into()));

    // Each user gets a distinct address.
    let other = s.register("dora", "password123", "10.0.0.4").await.json();
    assert_ne!(other["address"], address.as_str());

    // Login matches the name ignoring case.
    let r = s.login("BOB.SMITH-1", "password123", "10.0.0.5").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json();
    assert_eq!(
        (t["token_type"].as_str(), t["expires_in"].as_i64()),
        (Some("bearer"), Some(86_400))
    );
    let token = t["access_token"].as_str().unwrap().to_string();
    let me = s
        .get(
            "/users/me",
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
    assert_eq!(me.status, 200);
    assert_eq!(
        me.json(),
        json!({"username": "Bob.Smith-1", "address": address, "balance_sats": 0, "pending_balance_sats": 0, "has_pending": false, "dust_sats": 0})
    );
    // Unknown user, wrong password and an invalid name answer identically.
    let wrong = s.login("Bob.Smith-1", "password124", "10.0.0.6").await;
    let unknown = s.login("nobody", "password123", "10.0.0.7").await;
    let invalid = s.login("no", "password123", "10.0.0.8").await;
    for r in [&wrong, &unknown, &invalid] {
        assert_eq!(r.status, 401);
        assert_eq!(r.json(), wrong.json());
        assert_eq!(r.code(), "invalid_credentials");
    }
    s.stop().await;
}

async fn concurrent_case_variants_register_once(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    for i in 0..5 {
        let (upper, lower) = (format!("Twin{i}"), format!("twin{i}"));
        let (a, b) = tokio::join!(
            s.register(&upper, "password123", "10.1.0.1"),
            s.register(&lower, "password123", "10.1.0.2")
        );
        let mut statuses = [a.status, b.status];
        statuses.sort();
        assert_eq!(statuses, [201, 409], "{} / {}", a.text(), b.text());
        let loser = if a.status == 409 { a } else { b };
        assert_eq!(loser.code(), "username_taken");
    }
    // Many concurrent registrations all get distinct derivation indexes/addresses.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            support::request(
                addr,
                "POST",
                "/auth/register",
                &[("x-forwarded-for", &format!("10.2.0.{i}"))],
                Some(
                    json!({"username": format!("par{i}"), "password": "password123"})
                        .to_string()
                        .into_bytes(),
                ),
            )
            .await
        }));
    }
    let mut addresses = std::collections::HashSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
        assert!(addresses.insert(r.json()["address"].as_str().unwrap().to_string()));
    }
    s.stop().await;
}

async fn tokens_are_checked_strictly(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let token = s.user("tess", "10.3.0.1").await;
    let secret = hex::decode(
        std::fs::read_to_string(env.data_dir.join("jwt-secret"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    let me = |t: String| {
        let s = &s;
        async move {
            s.get("/users/me", &[("authorization", &format!("Bearer {t}"))])
                .await
        }
    };
    assert_eq!(me(token.clone()).await.status, 200);
    assert_eq!(s.get("/users/me", &[]).await.code(), "not_authenticated");
    assert_eq!(s.get("/users/me", &[]).await.status, 401);
    let claims: serde_json::Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    let sub = claims["sub"].as_str().unwrap().to_string();
    assert_eq!(claims["tv"], 0);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        86_400
    );
    // Correctly signed by the real secret, but past exp.
    let expired = sign(
        &secret,
        r#"{"alg":"HS256","typ":"JWT"}"#,
        json!({"sub": sub, "tv": 0, "iat": now() - 90_000, "exp": now() - 10}),
    );
    let r = me(expired).await;
    assert_eq!((r.status, r.code()), (401, "session_expired".into()));
    // Same secret, another algorithm name / alg none / unsigned.
    let hs512 = sign(
        &secret,
        r#"{"alg":"HS512","typ":"JWT"}"#,
        json!({"sub": sub, "tv": 0, "iat": now(), "exp": now() + 100}),
    );
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD
            .encode(json!({"sub": sub, "tv": 0, "iat": now(), "exp": now() + 100}).to_string())
    );
    let bad_sig = sign(
        b"not the secret",
        r#"{"alg":"HS256","typ":"JWT"}"#,
        json!({"sub": sub, "tv": 0, "iat": now(), "exp": now() + 100}),
    );
    for t in [
        hs512,
        none,
        bad_sig,
        "garbage".to_string(),
        format!("{token}x"),
    ] {
        let r = me(t.clone()).await;
        assert_eq!((r.status, r.code()), (401, "invalid_token".into()), "{t}");
    }
    // tv mismatch (a well-signed token of an older token version) is session_expired.
    let future_tv = sign(
        &secret,
        r#"{"alg":"HS256","typ":"JWT"}"#,
        json!({"sub": sub, "tv": 5, "iat": now(), "exp": now() + 100}),
    );
    assert_eq!(me(future_tv.clone()).await.code(), "session_expired");
    bets_check_their_token(&s, &secret, &sub, &token, future_tv).await;
    s.stop().await;
}

/// A bet checks its token in the payment's own read (not the AuthUser extractor's): the same answers, and nothing written.
async fn bets_check_their_token(s: &Api, secret: &[u8], sub: &str, token: &str, future_tv: String) {
    let bet = |t: String| {
        let s = &s;
        async move {
            s.post(
                "/rounds/current/bets",
                &[("authorization", &format!("Bearer {t}"))],
                json!({"amount_sats": 10_000}),
            )
            .await
        }
    };
    let stranger = sign(
        secret,
        r#"{"alg":"HS256","typ":"JWT"}"#,
        json!({"sub": "999999", "tv": 0, "iat": now(), "exp": now() + 100}),
    );
    let expired_bet = sign(
        secret,
        r#"{"alg":"HS256","typ":"JWT"}"#,
        json!({"sub": sub, "tv": 0, "iat": now() - 90_000, "exp": now() - 10}),
    );
    for (t, code) in [
        (future_tv, "session_expired"),
        (expired_bet, "session_expired"),
        (stranger, "invalid_token"),
        ("garbage".to_string(), "invalid_token"),
        (format!("{token}x"), "invalid_token"),
    ] {
        let r = bet(t.clone()).await;
        assert_eq!((r.status, r.code()), (401, code.into()), "{t}");
    }
    // The valid token gets past the session check (no coins: refused for that).
    let r = bet(token.to_string()).await;
    assert_eq!((r.status, r.code()), (422, "insufficient_funds".into()));
}

async fn change_password_rotates_sessions(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let old = s.user("Carol", "10.4.0.1").await;
    let auth = |t: &str| vec![("authorization".to_string(), format!("Bearer {t}"))];
    let hdr = |v: &Vec<(String, String)>| {
        v.iter()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect::<Vec<_>>()
    };
    let change = |t: String, cur: &'static str, new: &'static str| {
        let s = &s;
        let h = hdr(&auth(&t));
        async move {
            let hh: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            s.post(
                "/users/me/change-password",
                &hh,
                json!({"current_password": cur, "new_password": new}),
            )
            .await
        }
    };
    let r = change(old.clone(), "wrongpassword", "newpassword1").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "current_password_incorrect");
    assert_eq!(
        r.json()["detail"]["message"],
        "current password is incorrect"
    );
    let r = change(old.clone(), "password123", "short").await;
    assert_eq!((r.status, r.code()), (422, "password_too_short".into()));
    assert_eq!(r.json()["detail"]["params"]["min_length"], 8);
    let r = change(old.clone(), "password123", "newpassword1").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let fresh = r.json()["access_token"].as_str().unwrap().to_string();
    let me_old = s
        .get("/users/me", &[("authorization", &format!("Bearer {old}"))])
        .await;
    assert_eq!(
        (me_old.status, me_old.code()),
        (401, "session_expired".into())
    );
    // A bet with the old token is refused by the check in the payment's
    // own read (bets do not use the AuthUser extractor).
    let bet_old = s
        .post(
            "/rounds/current/bets",
            &[("authorization", &format!("Bearer {old}"))],
            json!({"amount_sats": 10_000}),
        )
        .await;
    assert_eq!(
        (bet_old.status, bet_old.code()),
        (401, "session_expired".into())
    );
    assert_eq!(
        s.get(
            "/users/me",
            &[("authorization", &format!("Bearer {fresh}"))]
        )
        .await
        .status,
        200
    );
    assert_eq!(
        s.login("carol", "password123", "10.4.0.2").await.status,
        401
    );
    assert_eq!(
        s.login("carol", "newpassword1", "10.4.0.2").await.status,
        200
    );
    // Unauthenticated change-password is refused.
    let r = s
        .post(
            "/users/me/change-password",
            &[],
            json!({"current_password": "a", "new_password": "b"}),
        )
        .await;
    assert_eq!((r.status, r.code()), (401, "not_authenticated".into()));
    s.stop().await;
}

async fn unparseable_stored_hash_is_a_wrong_password(db: Db) {
    let env = Env::new(db).await;
    let s = env.start(&[]).await;
    s.user("mallory", "10.5.0.1").await;
    let pool = env.pool().await;
    sqlx::query("UPDATE users SET password_hash = 'not-a-phc-string' WHERE username = 'mallory'")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let r = s.login("mallory", "password123", "10.5.0.2").await;
    assert_eq!(
        (r.status, r.code()),
        (401, "invalid_credentials".into()),
        "never a 500"
    );
    assert!(s.log().contains("unparseable"), "logged as an error");
    s.stop().await;
}
