//! Black-box: admin access, config validation and audit, pause/resume, password reset, and GET /rounds/current (SQLite and PostgreSQL).

use crate::support;

use serde_json::json;
use support::{Db, Env, ADMIN};

both_databases!(
    admin_token_unset_or_empty_never_grants,
    config_validation_and_audit_diff,
    pause_resume_are_idempotent_and_audited,
    admin_reset_revokes_sessions_without_a_token,
    current_round_with_optional_token,
);

/// A mainnet address (BIP84 test vector) — valid, but of another network.
const MAINNET: &str = "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu";

async fn admin_token_unset_or_empty_never_grants(db: Db) {
    let env = Env::new(db).await;
    for extra in [vec![], vec!["--admin-token", ""]] {
        let s = env
            .start_raw(
                &[
                    &["--argon2-memory-kib", "64", "--argon2-iterations", "1"][..],
                    &extra[..],
                ]
                .concat(),
            )
            .await;
        for headers in [
            vec![],
            vec![("x-admin-token", "")],
            vec![("x-admin-token", ADMIN)],
            vec![("x-admin-token", "x")],
        ] {
            let r = s.get("/admin/config", &headers).await;
            assert_eq!(r.status, 403, "{extra:?} {headers:?}");
            assert!(r.json()["detail"].is_string(), "bare string detail");
            let r = s.post("/admin/pause", &headers, json!({})).await;
            assert_eq!(r.status, 403);
        }
        assert_eq!(s.get("/rounds/current", &[]).await.json()["paused"], false);
        s.stop().await;
    }
    let s = support::spawn_app(&env).await;
    assert_eq!(s.get("/admin/config", &[]).await.status, 403);
    assert_eq!(
        s.get("/admin/config", &[("x-admin-token", "wrong")])
            .await
            .status,
        403
    );
    assert_eq!(
        s.get("/admin/config", &[("x-admin-token", "")])
            .await
            .status,
        403
    );
    assert_eq!(
        s.get("/admin/config", &[("x-admin-token", &format!("{ADMIN}x"))])
            .await
            .status,
        403
    );
    assert_eq!(s.admin_get("/admin/config").await.status, 200);
    s.stop().await;
}

async fn config_validation_and_audit_diff(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let initial = s.admin_get("/admin/config").await.json();
    assert!(
        initial["fee_address"]
            .as_str()
            .unwrap()
            .starts_with("bcrt1q"),
        "a working fee address from the service's wallet"
    );
    assert_eq!(initial["paused"], false);
    for (body, needle) in [
        (
            json!({"fee_rate_sat_vb": 0}),
            "fee_rate_sat_vb must be at least 1",
        ),
        (
            json!({"round_duration_seconds": 0}),
            "round_duration_seconds must be at least 1",
        ),
        (
            json!({"fee_rate_sat_vb": 10_001}),
            "fee_rate_sat_vb must be at most 10000",
        ),
        (
            json!({"round_duration_seconds": 604_801}),
            "round_duration_seconds must be at most 604800",
        ),
        (json!({"fee_address": MAINNET}), "another network"),
        (json!({"fee_address": "bcrt1qnot-an-address"}), "malformed"),
        (json!({"paused": true}), "paused is read-only"),
        (json!({"nonsense": 1}), "nonsense is not a config field"),
    ] {
        let r = s.admin_put("/admin/config", body.clone()).await;
        assert_eq!(r.status, 422, "{body}");
        let detail = r.json()["detail"].as_str().unwrap().to_string();
        assert!(detail.contains(needle), "{body}: {detail}");
    }
    // The same validator as withdrawals: the other-network and malformed messages differ.
    let a = s
        .admin_put("/admin/config", json!({"fee_address": MAINNET}))
        .await
        .json();
    let b = s
        .admin_put("/admin/config", json!({"fee_address": "xyz"}))
        .await
        .json();
    assert_ne!(a, b);
    let audit = s.admin_get("/admin/audit").await.json();
    assert_eq!(
        audit["entries"].as_array().unwrap().len(),
        0,
        "rejected updates write nothing"
    );

    let fee_address = s
        .register("feeuser", "password123", "10.9.0.1")
        .await
        .json()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s
        .admin_put("/admin/config", json!({"fee_address": fee_address, "fee_rate_sat_vb": 1, "round_duration_seconds": initial["round_duration_seconds"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["fee_rate_sat_vb"], 1);
    assert_eq!(r.json()["fee_address"], fee_address.as_str());
    // No-op update: 200, no new entry.
    assert_eq!(
        s.admin_put("/admin/config", json!({"fee_rate_sat_vb": 1}))
            .await
            .status,
        200
    );
    let audit = s.admin_get("/admin/audit").await.json();
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{audit}");
    assert_eq!(entries[0]["event"], "config_updated");
    assert_eq!(entries[0]["actor"], "admin");
    assert_eq!(
        entries[0]["diff"],
        json!({
            "fee_address": {"before": initial["fee_address"], "after": fee_address},
            "fee_rate_sat_vb": {"before": initial["fee_rate_sat_vb"], "after": 1},
        }),
        "only changed fields, before values taken before the update"
    );
    assert!(entries[0]["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        s.admin_get("/admin/config").await.json()["fee_rate_sat_vb"],
        1
    );
    // Bad paging is a bare-string 422.
    let r = s.admin_get("/admin/audit?limit=0").await;
    assert_eq!(r.status, 422);
    assert!(r.json()["detail"].is_string());
    s.stop().await;
}

async fn pause_resume_are_idempotent_and_audited(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let mut stream = support::EventStream::open(s.addr, "10.8.0.1").await;
    assert_eq!(stream.status, 200);
    let r = s.admin_post("/admin/pause", json!({})).await;
    assert_eq!((r.status, r.json()["paused"].as_bool()), (200, Some(true)));
    assert!(
        stream.next_refetch(std::time::Duration::from_secs(5)).await,
        "pause notifies"
    );
    assert_eq!(s.get("/rounds/current", &[]).await.json()["paused"], true);
    let r = s.admin_post("/admin/pause", json!({})).await;
    assert_eq!((r.status, r.json()["paused"].as_bool()), (200, Some(true)));
    assert_eq!(
        stream
            .count_refetches(std::time::Duration::from_millis(500))
            .await,
        0,
        "a no-op pause does not notify"
    );
    assert_eq!(
        s.admin_post("/admin/resume", json!({})).await.json()["paused"],
        false
    );
    assert!(
        stream.next_refetch(std::time::Duration::from_secs(5)).await,
        "resume notifies"
    );
    assert_eq!(s.admin_post("/admin/resume", json!({})).await.status, 200);
    assert_eq!(s.get("/rounds/current", &[]).await.json()["paused"], false);
    let audit = s.admin_get("/admin/audit").await.json();
    let events: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["resumed", "paused"],
        "entries only for real changes, newest first"
    );
    // Paging.
    let page = s.admin_get("/admin/audit?limit=1").await.json();
    assert_eq!(page["entries"].as_array().unwrap().len(), 1);
    let next = page["next_before_id"].as_i64().unwrap();
    let page2 = s
        .admin_get(&format!("/admin/audit?limit=1&before_id={next}"))
        .await
        .json();
    assert_eq!(page2["entries"][0]["event"], "paused");
    s.stop().await;
}

async fn admin_reset_revokes_sessions_without_a_token(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app(&env).await;
    let token = s.user("Erin", "10.7.0.1").await;
    let r = s
        .admin_post(
            "/admin/users/eRIN/reset-password",
            json!({"new_password": "short"}),
        )
        .await;
    assert_eq!(r.status, 422);
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("new_password must be at least 8"));
    let r = s
        .admin_post(
            "/admin/users/nobody/reset-password",
            json!({"new_password": "longenough1"}),
        )
        .await;
    assert_eq!(r.status, 404);
    assert!(r.json()["detail"].is_string());
    let r = s
        .post(
            "/admin/users/erin/reset-password",
            &[],
            json!({"new_password": "longenough1"}),
        )
        .await;
    assert_eq!(r.status, 403);
    let r = s
        .admin_post(
            "/admin/users/eRIN/reset-password",
            json!({"new_password": "longenough1"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"username": "Erin", "token_version": 1}),
        "no token returned"
    );
    let me = s
        .get(
            "/users/me",
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
    assert_eq!((me.status, me.code()), (401, "session_expired".into()));
    assert_eq!(s.login("erin", "password123", "10.7.0.2").await.status, 401);
    assert_eq!(s.login("erin", "longenough1", "10.7.0.2").await.status, 200);
    let audit = s.admin_get("/admin/audit").await.json();
    assert_eq!(audit["entries"][0]["event"], "password_reset");
    assert_eq!(audit["entries"][0]["details"]["username"], "Erin");
    s.stop().await;
}

async fn current_round_with_optional_token(db: Db) {
    let env = Env::new(db).await;
    let s = support::spawn_app_with(&env, |c| c.default_round_duration_seconds = 300).await;
    let anon = s.get("/rounds/current", &[]).await;
    assert_eq!(anon.status, 200);
    let round = anon.json();
    assert_eq!(round["status"], "open");
    assert_eq!(round["user_played"], false);
    assert_eq!(round["paused"], false);
    assert!(round["draw"].is_null() && round["payout"].is_null());
    assert_eq!(
        (round["pot_sats"].as_i64(), round["bettors"].as_i64()),
        (Some(0), Some(0))
    );
    let id = round["id"].as_i64().unwrap();
    let opened = round["opened_at"].as_str().unwrap();
    let closes = round["closes_at"].as_str().unwrap();
    assert!(opened.ends_with('Z') && closes.ends_with('Z'));
    let secs = |t: &str| -> i64 {
        let (h, m, sec) = (&t[11..13], &t[14..16], &t[17..19]);
        h.parse::<i64>().unwrap() * 3600
            + m.parse::<i64>().unwrap() * 60
            + sec.parse::<i64>().unwrap()
    };
    assert_eq!(
        (secs(closes) - secs(opened)).rem_euclid(86_400),
        300,
        "closes_at = opened_at + round_duration_seconds"
    );
    let token = s.user("frank", "10.6.0.1").await;
    let auth = format!("Bearer {token}");
    let r = s
        .get("/rounds/current", &[("authorization", &auth)])
        .await
        .json();
    assert_eq!(r["user_played"], false);
    // A bet row (part 2 writes these) makes user_played true for that user only.
    let pool = env.pool().await;
    let uid: i64 = sqlx::query_scalar("SELECT id FROM users WHERE username = 'frank'")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO bets (round_id, user_id, amount_sats, created_at) VALUES ($1, $2, 5000, 0)",
    )
    .bind(id)
    .bind(uid)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(
        s.get("/rounds/current", &[("authorization", &auth)])
            .await
            .json()["user_played"],
        true
    );
    assert_eq!(
        s.get("/rounds/current", &[]).await.json()["user_played"],
        false
    );
    // A bad token on this endpoint is treated as no token.
    let r = s
        .get("/rounds/current", &[("authorization", "Bearer nonsense")])
        .await;
    assert_eq!(
        (r.status, r.json()["user_played"].as_bool()),
        (200, Some(false))
    );
    // Restarting keeps the same round (created once).
    s.stop().await;
    let s = support::spawn_app(&env).await;
    assert_eq!(s.get("/rounds/current", &[]).await.json()["id"], id);
    s.stop().await;
}
